/*
 * bench_ngram.c - n-gram drafting on chats that quote their own context
 * (issue 18): tokens per pass the n-gram draft would give when the model's
 * answer is the given text.
 *
 *   bench_ngram TOKENIZER_DIR [WIDTH ...]
 *
 * Each case is a conversation rendered with K3's chat format and
 * tokenized with the real K3 tokenizer (../shared/models/kimi-k3-tokenizer),
 * and an answer that quotes it (an edited code block, a tool call that
 * repeats the user's values, a summary quoting a passage). The answer's
 * ids stand in for the target's greedy ids: each pass the n-gram draft
 * proposes up to WIDTH ids from the context, the longest prefix equal to
 * the answer is accepted plus the next id (what verification would
 * commit), and the pass count is what k3d would run. It measures the
 * draft, not a model: a trained K3 writing these answers would see these
 * acceptances; the demo models (random weights) never quote anything.
 * No model runs here, the trained demo model included: it is too small to
 * write these answers (it cannot copy a question's city, let alone edit
 * code); the draft against a real model's greedy text is
 * bench_draft_chat.py's, on the trained model (docs/draft.md).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "draft/draft_ngram.h"
#include "text/text_chat.h"
#include "text/text_tok.h"

struct chat_case {
	const char *name, *user, *answer;
};

static const struct chat_case cases[] = {
	{ "code edit",
	  "Rename `count` to `total` in this function and keep everything else:\n\n"
	  "```c\nstatic int sum_values(const int *values, size_t n)\n{\n\tint count = 0;\n"
	  "\tfor (size_t i = 0; i < n; i++)\n\t\tcount += values[i];\n\treturn count;\n}\n```",
	  "Here is the function with `count` renamed to `total`:\n\n"
	  "```c\nstatic int sum_values(const int *values, size_t n)\n{\n\tint total = 0;\n"
	  "\tfor (size_t i = 0; i < n; i++)\n\t\ttotal += values[i];\n\treturn total;\n}\n```\n\n"
	  "Nothing else changed." },
	{ "tool call",
	  "Book a table for four at Chez Martin on 2026-12-14 at 19:30 under the name "
	  "Eleanor Whitfield, phone +44 20 7946 0321.",
	  "{\"name\": \"book_table\", \"arguments\": {\"restaurant\": \"Chez Martin\", "
	  "\"date\": \"2026-12-14\", \"time\": \"19:30\", \"party_size\": 4, "
	  "\"name\": \"Eleanor Whitfield\", \"phone\": \"+44 20 7946 0321\"}}" },
	{ "quoted passage",
	  "Quote the sentence about the harbour from this text, then say what it means.\n\n"
	  "The town grew slowly until the railway came in 1871. The harbour, silted up "
	  "since the great storm of 1836, was dredged again only in 1903, and by then the "
	  "fishing fleet had moved to the deeper bay in the north. Today the old quays "
	  "hold cafes and a small museum.",
	  "The sentence is: \"The harbour, silted up since the great storm of 1836, was "
	  "dredged again only in 1903, and by then the fishing fleet had moved to the deeper "
	  "bay in the north.\" It means that the harbour was unusable for decades after the "
	  "storm of 1836, and when it was finally dredged in 1903 the fishing fleet had "
	  "already moved to the deeper bay in the north." },
};

/* Passes to produce answer[0..n) after ctx with width w; *acc / *prop
 * the accepted and proposed counts. */
static unsigned simulate(struct k3_draft *d, const struct k3_tok_ids *prompt,
			 const struct k3_tok_ids *answer, uint32_t w, unsigned *acc, unsigned *prop)
{
	size_t n = prompt->n + answer->n;
	uint32_t *ctx = malloc(n * sizeof(uint32_t)), out[64];
	struct k3_err err = { 0, "" };
	unsigned passes = 0;
	size_t have = prompt->n, gen = 0;

	memcpy(ctx, prompt->v, prompt->n * sizeof(uint32_t));
	memcpy(ctx + prompt->n, answer->v, answer->n * sizeof(uint32_t));
	k3_draft_reset(d);
	*acc = *prop = 0;
	/* the first answer id comes from the prefill pass */
	gen = 1;
	have++;
	passes = 1;
	while (gen < answer->n) {
		uint32_t left = (uint32_t)(answer->n - gen), max = w < left - 1 ? w : left - 1;
		int r = max ? k3_draft_propose(d, ctx, have, max, out, &err) : 0;
		uint32_t m = 0;
		if (r < 0)
			break;
		while (m < (uint32_t)r && out[m] == ctx[have + m])
			m++;
		*prop += (unsigned)r;
		*acc += m;
		gen += m + 1;
		have += m + 1;
		passes++;
	}
	free(ctx);
	return passes;
}

int main(int argc, char **argv)
{
	struct k3_err err = { 0, "" };
	struct k3_tok *tok = NULL;
	struct k3_draft *d = NULL;
	uint32_t widths[8] = { 3, 5, 7 }, n_w = 3;

	if (argc < 2) {
		fprintf(stderr, "usage: bench_ngram TOKENIZER_DIR [WIDTH ...]\n");
		return 2;
	}
	if (argc > 2) {
		n_w = 0;
		for (int i = 2; i < argc && n_w < 8; i++)
			widths[n_w++] = (uint32_t)atoi(argv[i]);
	}
	if (k3_tok_load_dir(argv[1], &tok, &err) || k3_draft_ngram_new(NULL, &d, &err)) {
		fprintf(stderr, "%s\n", err.msg);
		return 1;
	}
	printf("# bench_ngram: n-gram draft (suffix 2..4) on chats quoting their context; "
	       "the answer's ids stand in for the target's\n");
	printf("%-16s %7s %7s %6s %9s %9s %7s\n", "case", "prompt", "answer", "width", "passes",
	       "ids/pass", "accept");
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", cases[c].user);
		struct k3_chat_opts o;
		struct k3_chat chat = { 0 };
		struct k3_tok_ids prompt, answer;
		k3_chat_opts_init(&o);
		o.thinking = false;
		k3_tok_ids_init(&prompt);
		k3_tok_ids_init(&answer);
		if (k3_chat_render(msgs, &o, &chat, &err) || k3_chat_encode(tok, &chat, &prompt, &err) ||
		    k3_tok_encode(tok, cases[c].answer, strlen(cases[c].answer), false, &answer, &err)) {
			fprintf(stderr, "%s: %s\n", cases[c].name, err.msg);
			return 1;
		}
		for (uint32_t i = 0; i < n_w; i++) {
			unsigned acc, prop;
			unsigned passes = simulate(d, &prompt, &answer, widths[i], &acc, &prop);
			printf("%-16s %7zu %7zu %6u %9u %9.2f %7.2f\n", cases[c].name, prompt.n, answer.n,
			       widths[i] + 1, passes, (double)answer.n / passes,
			       prop ? (double)acc / prop : 0.0);
		}
		k3_chat_release(&chat);
		k3_tok_ids_release(&prompt);
		k3_tok_ids_release(&answer);
		json_decref(msgs);
	}
	k3_draft_free(d);
	k3_tok_free(tok);
	return 0;
}
