/*
 * test_chat_real.c - segment-wise ids of every golden chat against the real
 * rank file (SKIP when it is absent).
 */
#include "chat_golden.h"
#include "text_golden.h"

static struct k3_tok *g_tok;
static int n_cases;

static void check_line(json_t *line, void *ud)
{
	const char *id = json_string_value(json_object_get(line, "id"));
	json_t *want = json_object_get(line, "ids");
	struct k3_chat_opts o;
	struct k3_chat c = { 0 };
	struct k3_tok_ids ids = { 0 };
	bool same;
	(void)ud;

	cg_opts(line, &o);
	T_EQ_INT(k3_chat_render(json_object_get(line, "messages"), &o, &c, NULL), 0);
	T_EQ_INT(k3_chat_encode(g_tok, &c, &ids, NULL), 0);
	same = ids.n == json_array_size(want);
	for (size_t i = 0; same && i < ids.n; i++)
		same = ids.v[i] == (uint32_t)json_integer_value(json_array_get(want, i));
	if (!T_OK(same))
		printf("     ids differ for %s (%zu vs %zu)\n", id, ids.n, json_array_size(want));
	n_cases++;
	k3_tok_ids_release(&ids);
	k3_chat_release(&c);
}

/* Every golden chat, rendered and encoded with the real rank file. */
static void test_golden(void)
{
	tg_each_line("golden/text/chat.jsonl", check_line, NULL);
	T_EQ_INT(n_cases, 23);
}

int main(void)
{
	static void (*const tests[])(void) = { test_golden, NULL };
	const char *why = NULL;
	struct k3_tok *tok = tg_real(&why);

	return tg_main(&g_tok, tok, why, tests);
}
