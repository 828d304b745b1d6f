/* The memory planner (store_plan.h): tier bytes from K3's real config.json
 * against the release's published sizes, the split at several limits (the
 * policy's choice, the invariants of the split, the floor refused with its
 * numbers), --spine-resident, --expert-cache-gb, --memory-limit, measured
 * bytes, and the spellings. */
#include "t.h"

#include <errno.h>

#include "model/inspect.h"
#include "model/model.h"
#include "store/store_plan.h"

#define GIB ((uint64_t)1 << 30)
#define MIB ((uint64_t)1 << 20)
#define EXPERT 17547264ull

/* Bytes the release's own files establish (docs/plan.md, "Sources"): shard
 * 2 of 96 holds exactly layer 1 (a KDA + MoE layer) and is 16,990,911,504
 * bytes with an 818,696-byte header; 896 experts of 17,547,264 bytes leave
 * 1,267,744,256 bytes of spine. The text tensors total 1,559,965,606,912
 * bytes (1,560,860,324,864 with the vision tower and projector). */
#define K3_LAYER1 1267744256ull
#define K3_TEXT_BYTES 1559965606912ull

static int load_config(const char *path, struct k3_model_config *c)
{
	char buf[1 << 16];
	struct k3_err err = { 0 };
	FILE *f = fopen(path, "r");

	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	int r = k3_model_config_parse(buf, n, c, &err);
	if (r)
		printf("config: %s\n", err.msg);
	return r;
}

/* A small model whose spine fits everywhere (the demo `small` shape). */
static const char small_json[] =
	"{\"model_type\":\"kimi_linear\",\"vocab_size\":8448,\"hidden_size\":512,"
	"\"num_hidden_layers\":12,\"intermediate_size\":1024,\"hidden_act\":\"situ\","
	"\"attn_res_block_size\":4,\"num_attention_heads\":8,\"num_key_value_heads\":8,"
	"\"q_lora_rank\":192,\"kv_lora_rank\":128,\"qk_nope_head_dim\":64,\"qk_rope_head_dim\":32,"
	"\"v_head_dim\":64,\"mla_use_nope\":true,\"mla_use_output_gate\":true,\"num_experts\":32,"
	"\"num_experts_per_token\":8,\"num_shared_experts\":2,\"moe_intermediate_size\":128,"
	"\"first_k_dense_replace\":1,\"routed_expert_hidden_size\":256,\"latent_moe_use_norm\":true,"
	"\"quantization_config\":{\"format\":\"mxfp4-pack-quantized\"},"
	"\"linear_attn_config\":{\"kda_layers\":[1,2,3,5,6,7,9,10],\"full_attn_layers\":[4,8,11,12],"
	"\"num_heads\":8,\"head_dim\":64,\"short_conv_kernel_size\":4,\"gate_lower_bound\":-5.0,"
	"\"use_full_rank_gate\":true}}";

/* Every planned byte is accounted for once. */
static void check_sums(const struct k3_store_plan_out *p)
{
	T_EQ_U64(p->headroom_bytes + p->state_bytes + p->scratch_bytes + p->spine_resident_bytes +
		 p->spine_ring_bytes + p->expert_cache_bytes + p->unused_bytes, p->limit_bytes);
	T_EQ_U64(p->expert_cache_bytes, (uint64_t)p->expert_slots * p->slot_bytes);
	T_OK(p->expert_cache_bytes >= p->expert_floor_bytes);
	T_EQ_U64(p->spine_ring_bytes, (uint64_t)p->ring_arenas * p->arena_bytes);
	T_OK(p->floor_bytes <= p->limit_bytes);
}

static void k3_tiers(const struct k3_model_config *c)
{
	/* Per-layer bytes with the release's dtypes. */
	T_EQ_U64(k3_store_plan_layer_bytes(c, 1, false), K3_LAYER1);
	T_EQ_U64(k3_store_plan_layer_bytes(c, 0, false), 2341213184ull);    /* KDA + dense MLP */
	T_EQ_U64(k3_store_plan_layer_bytes(c, 3, false), 844335616ull);     /* MLA + MoE */
	T_EQ_U64(k3_store_plan_layer_bytes(c, 92, false), 844335616ull);
	T_EQ_U64(k3_store_plan_layer_bytes(c, 93, false), 0);
	T_EQ_U64(k3_store_plan_expert_bytes(c), EXPERT);
	T_EQ_U64(k3_store_plan_embed_bytes(c), 163840ull * 7168 * 2);
	T_EQ_U64(k3_store_plan_head_bytes(c, false), 163840ull * 7168 * 2 + 3 * 7168 * 2);
	uint64_t spine = k3_store_plan_embed_bytes(c) + k3_store_plan_head_bytes(c, false);
	for (uint32_t l = 0; l < 93; l++)
		spine += k3_store_plan_layer_bytes(c, l, false);
	T_EQ_U64(spine, 113509540864ull);
	T_EQ_U64(spine + 92ull * 896 * EXPERT, K3_TEXT_BYTES);
	/* int8: about half the matrices; norms, taps and the embedding stay. */
	uint64_t i8 = k3_store_plan_layer_bytes(c, 1, true);
	T_OK(i8 < K3_LAYER1 / 2 + 8 * MIB && i8 > K3_LAYER1 / 2 - 8 * MIB);
	T_EQ_U64(k3_store_plan_embed_bytes(c), 163840ull * 7168 * 2);
}

static void k3_plans(const struct k3_model_config *c)
{
	struct k3_store_plan_in in = { .cfg = c, .cgroup_bytes = UINT64_MAX,
				       .spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT };
	struct k3_store_plan_out p, q;
	struct k3_err err = { 0 };

	/* 64 GiB: the spine streams; the head and the longest prefix the
	 * ring leaves room for are resident, the embedding gathered. */
	in.ram_bytes = 64 * GIB;
	T_EQ_INT(k3_store_plan_compute(&in, &p, &err), 0);
	T_EQ_U64(p.limit_bytes, 64 * GIB);
	T_EQ_STR(p.limited_by, "RAM");
	T_EQ_U64(p.headroom_bytes, 64 * GIB / 10);
	T_EQ_INT(p.context_tokens, K3_STORE_PLAN_DEFAULT_CONTEXT);
	T_EQ_U64(p.kda_state_bytes, 69ull * (3 * 3 * 12288 + 96 * 128 * 128) * 4);
	T_EQ_U64(p.mla_cache_bytes, 24ull * 32768 * 577 * 4 + 96ull * 32768 * 4);
	T_EQ_U64(p.expert_floor_bytes, 16 * EXPERT);
	T_EQ_U64(p.expert_pool, 92ull * 896);
	T_OK(p.resident_layers > 0 && p.resident_layers < 93);
	T_OK(p.head_resident);
	T_OK(!p.embed_resident);
	T_EQ_INT(p.ring_arenas, 2);
	T_EQ_U64(p.arena_bytes, (K3_LAYER1 + 4095) / 4096 * 4096);   /* layer 0 (the largest) is resident */
	check_sums(&p);
	/* One more layer resident does not fit: the prefix is the longest. */
	uint32_t R = p.resident_layers;
	T_OK(p.expert_cache_bytes - p.expert_floor_bytes + p.unused_bytes < p.layer_spine_bytes[R]);
	in.spine_resident = (int32_t)R + 1;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), -ENOMEM);
	T_OK(strstr(err.msg, "--spine-resident") != NULL);
	in.spine_resident = (int32_t)R;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), 0);
	T_EQ_INT(q.resident_layers, R);
	T_OK(q.head_resident);
	T_EQ_U64(q.expert_cache_bytes, p.expert_cache_bytes);
	in.spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT;
	/* A cold token reads every streamed layer and one embedding row, and
	 * 16 experts in each of 92 MoE layers. */
	uint64_t streamed = 0;
	for (uint32_t l = R; l < 93; l++)
		streamed += p.layer_spine_bytes[l];
	T_EQ_U64(p.cold_spine_bytes_per_pass, streamed + p.embed_row_bytes);
	T_EQ_U64(p.embed_row_bytes, 16384 + 4096);
	T_EQ_U64(p.cold_expert_bytes_per_token, 92ull * 16 * EXPERT);
	T_OK(p.uniform_expert_bytes_per_token < p.cold_expert_bytes_per_token);

	/* 256 GiB: everything resident, the rest to the expert cache. */
	in.ram_bytes = 256 * GIB;
	T_EQ_INT(k3_store_plan_compute(&in, &p, &err), 0);
	T_EQ_INT(p.resident_layers, 93);
	T_OK(p.head_resident && p.embed_resident);
	T_EQ_INT(p.ring_arenas, 0);
	T_EQ_U64(p.spine_resident_bytes, 113509540864ull);
	T_EQ_U64(p.cold_spine_bytes_per_pass, 0);
	T_EQ_U64(p.expert_slots, (256 * GIB - p.headroom_bytes - p.state_bytes - p.scratch_bytes -
				  113509540864ull) / EXPERT);
	check_sums(&p);
	/* With the spine loader (any --spine-resident) the embedding's rows
	 * are gathered: every layer and the head held, one row read a pass. */
	uint64_t embed = k3_store_plan_embed_bytes(c);
	for (int i = 0; i < 2; i++) {
		in.spine_resident = i ? K3_STORE_PLAN_RESIDENT_ALL : K3_STORE_PLAN_RESIDENT_AUTO;
		T_EQ_INT(k3_store_plan_compute(&in, &q, &err), 0);
		T_EQ_INT(q.resident_layers, 93);
		T_OK(q.head_resident && !q.embed_resident);
		T_EQ_U64(q.spine_resident_bytes, 113509540864ull - embed);
		T_EQ_U64(q.spine_ring_bytes, 0);
		T_EQ_U64(q.cold_spine_bytes_per_pass, q.embed_row_bytes);
		T_EQ_U64(q.expert_slots, (256 * GIB - q.headroom_bytes - q.state_bytes - q.scratch_bytes -
					  (113509540864ull - embed)) / EXPERT);
		check_sums(&q);
	}

	/* --spine-resident all where it does not fit: refused, with numbers. */
	in.ram_bytes = 64 * GIB;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), -ENOMEM);
	T_OK(strstr(err.msg, "--spine-resident all") != NULL);
	T_OK(strstr(err.msg, "68719476736 bytes") != NULL);   /* the limit */

	/* none: nothing resident, the ring holds the head, the largest item. */
	in.spine_resident = K3_STORE_PLAN_RESIDENT_NONE;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), 0);
	T_EQ_INT(q.resident_layers, 0);
	T_OK(!q.head_resident && !q.embed_resident);
	T_EQ_U64(q.arena_bytes, (k3_store_plan_head_bytes(c, false) + 4095) / 4096 * 4096);
	T_EQ_U64(q.cold_spine_bytes_per_pass, 113509540864ull - k3_store_plan_embed_bytes(c) +
					      q.embed_row_bytes);
	check_sums(&q);
	in.spine_resident = 94;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), -EINVAL);
	in.spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT;

	/* --memory-limit 16G below RAM: it sets the limit and a smaller
	 * headroom (a target for k3d's own RSS). The rehearsal's setting. */
	in.ram_bytes = 24 * GIB;
	in.memory_limit_bytes = 16 * GIB;
	in.context_tokens = 4096;
	T_EQ_INT(k3_store_plan_compute(&in, &p, &err), 0);
	T_EQ_STR(p.limited_by, "--memory-limit");
	T_EQ_U64(p.headroom_bytes, 16 * GIB / 10);
	T_OK(p.resident_layers < 93 && p.ring_arenas == 2);
	check_sums(&p);
	/* A cgroup below both. */
	in.cgroup_bytes = 12 * GIB;
	T_EQ_INT(k3_store_plan_compute(&in, &p, &err), 0);
	T_EQ_STR(p.limited_by, "cgroup memory.max");
	T_EQ_U64(p.headroom_bytes, 2 * GIB);
	in.cgroup_bytes = UINT64_MAX;
	in.memory_limit_bytes = 0;
	in.context_tokens = 0;

	/* Below the floor: refused with every number. */
	in.ram_bytes = 8 * GIB;
	T_EQ_INT(k3_store_plan_compute(&in, &p, &err), -ENOMEM);
	T_OK(strstr(err.msg, "8589934592 bytes") != NULL);
	T_OK(strstr(err.msg, "the floor, the smallest limit one pass fits in, is") != NULL);
	T_OK(strstr(err.msg, "16 experts of 17547264 bytes") != NULL);
	T_OK(strstr(err.msg, "for 32768 tokens") != NULL);
	T_OK(p.floor_bytes > 8 * GIB);
	/* The floor itself is enough (its headroom is the same 2 GiB): nothing
	 * resident, every layer and the head through the ring. */
	in.ram_bytes = p.floor_bytes;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), 0);
	T_EQ_U64(q.floor_bytes, p.floor_bytes);
	T_EQ_INT(q.resident_layers, 0);
	T_OK(!q.head_resident);
	T_EQ_INT(q.expert_slots, 16);
	check_sums(&q);
	in.ram_bytes = p.floor_bytes - 1;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), -ENOMEM);

	/* --expert-cache-gb: below the floor, or more than the limit holds
	 * beside the smallest spine, is refused; else exactly that many slots
	 * and the spine takes what is left. */
	in.ram_bytes = 64 * GIB;
	in.expert_cache_bytes = 15 * EXPERT;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), -ENOMEM);
	T_OK(strstr(err.msg, "below the floor of 280756224 bytes: one token pins 16 experts of 17547264 bytes") != NULL);
	in.expert_cache_bytes = 60 * GIB;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), -ENOMEM);
	T_OK(strstr(err.msg, "--expert-cache-gb") != NULL);
	in.expert_cache_bytes = 20000000000ull;
	T_EQ_INT(k3_store_plan_compute(&in, &q, &err), 0);
	T_EQ_INT(q.expert_slots, 20000000000ull / EXPERT);
	T_OK(q.resident_layers < R);   /* the spine gave way to the explicit cache */
	check_sums(&q);
	in.expert_cache_bytes = 0;
}

static void small_plans(void)
{
	struct k3_model_config c;
	struct k3_err err = { 0 };
	struct k3_store_plan_out p;

	T_EQ_INT(k3_model_config_parse(small_json, sizeof(small_json) - 1, &c, &err), 0);
	/* 128 GiB: all resident; the cache is the rest, capped at the pool:
	 * more than every expert buys nothing. */
	struct k3_store_plan_in in = { .cfg = &c, .ram_bytes = 128 * GIB, .cgroup_bytes = UINT64_MAX,
				       .spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT };
	T_EQ_INT(k3_store_plan_compute(&in, &p, &err), 0);
	T_EQ_INT(p.resident_layers, 12);
	T_OK(p.embed_resident && p.head_resident);
	T_EQ_U64(p.expert_slots, 11 * 32);
	T_EQ_U64(p.slot_bytes, (k3_store_plan_expert_bytes(&c) + 4095) / 4096 * 4096);
	check_sums(&p);

	/* A limit a few times below the spine (the streaming tests' setup):
	 * --memory-limit's headroom is a tenth, at least 32 MiB. */
	uint64_t spine = p.spine_total_bytes;
	in.memory_limit_bytes = 32 * MIB + spine / 3 + p.state_bytes + p.scratch_bytes + 8 * MIB;
	T_EQ_INT(k3_store_plan_compute(&in, &p, &err), 0);
	T_EQ_U64(p.headroom_bytes, p.limit_bytes / 10 > 32 * MIB ? p.limit_bytes / 10 : 32 * MIB);
	T_OK(p.resident_layers < 12);
	T_OK(!p.embed_resident);
	check_sums(&p);

	/* Measured bytes replace the config's. */
	static struct k3_model_bytes b;
	memset(&b, 0, sizeof(b));
	b.n_layers = 12;
	for (uint32_t l = 0; l < 12; l++)
		b.layer[l].attn = 1000000 + l;
	b.embed = 3000000;
	b.lm_head = 2000000;
	b.final = 3000;
	b.expert_span = 200000;
	struct k3_store_plan_in mi = { .cfg = &c, .bytes = &b, .ram_bytes = 128 * GIB,
				       .cgroup_bytes = UINT64_MAX, .slot_bytes = 204800,
				       .spine_resident = K3_STORE_PLAN_RESIDENT_DEFAULT };
	T_EQ_INT(k3_store_plan_compute(&mi, &p, &err), 0);
	T_EQ_U64(p.layer_spine_bytes[11], 1000011);
	T_EQ_U64(p.head_bytes, 2003000);
	T_EQ_U64(p.spine_total_bytes, 12 * 1000000 + 66 + 3000000 + 2003000);
	T_EQ_U64(p.slot_bytes, 204800);

	/* The spine loader's own unit sizes override both. */
	uint64_t units[12];
	for (uint32_t l = 0; l < 12; l++)
		units[l] = 2000000 + 4096 * l;
	mi.layer_bytes = units;
	mi.head_bytes = 2100000;
	mi.embed_bytes = 3100000;
	mi.embed_row_bytes = 8192;
	mi.spine_resident = K3_STORE_PLAN_RESIDENT_NONE;
	T_EQ_INT(k3_store_plan_compute(&mi, &p, &err), 0);
	T_EQ_U64(p.layer_spine_bytes[11], 2000000 + 4096 * 11);
	T_EQ_U64(p.head_bytes, 2100000);
	T_EQ_U64(p.embed_bytes, 3100000);
	T_EQ_U64(p.arena_bytes, (2100000 + 4095) / 4096 * 4096);
	T_EQ_U64(p.cold_spine_bytes_per_pass, 12 * 2000000 + 4096 * 66 + 2100000 + 8192);
}

/* The config's bytes are the checkpoint's: both golden checkpoints and a
 * demo model store the release's dtypes, so k3ctl plan (config only) and
 * k3d (measured) plan the same. */
static void measured_equals_config(const char *dir)
{
	struct k3_model *m;
	struct k3_err err = { 0 };
	static struct k3_model_bytes b;

	if (k3_model_open(dir, &m, &err)) {
		printf("FAIL: %s: %s\n", dir, err.msg);
		T_OK(0);
		return;
	}
	const struct k3_model_config *c = k3_model_config(m);
	k3_model_bytes(m, &b);
	for (uint32_t l = 0; l < c->num_hidden_layers; l++) {
		uint64_t got = b.layer[l].attn + b.layer[l].norms + b.layer[l].mlp + b.layer[l].moe_spine;
		if (got != k3_store_plan_layer_bytes(c, l, false))
			printf("     %s layer %u\n", dir, l);
		T_EQ_U64(got, k3_store_plan_layer_bytes(c, l, false));
	}
	T_EQ_U64(b.embed, k3_store_plan_embed_bytes(c));
	T_EQ_U64(b.lm_head + b.final, k3_store_plan_head_bytes(c, false));
	T_EQ_U64(b.expert_span, k3_store_plan_expert_bytes(c));
	k3_model_free(m);
}

static void spellings(void)
{
	struct k3_err err = { 0 };
	int32_t r;
	char buf[16];

	T_EQ_INT(k3_store_plan_parse_resident("auto", &r, &err), 0);
	T_EQ_INT(r, K3_STORE_PLAN_RESIDENT_AUTO);
	T_EQ_INT(k3_store_plan_parse_resident("all", &r, &err), 0);
	T_EQ_INT(r, K3_STORE_PLAN_RESIDENT_ALL);
	T_EQ_INT(k3_store_plan_parse_resident("none", &r, &err), 0);
	T_EQ_INT(r, K3_STORE_PLAN_RESIDENT_NONE);
	T_EQ_INT(k3_store_plan_parse_resident("40", &r, &err), 0);
	T_EQ_INT(r, 40);
	T_EQ_STR(k3_store_plan_resident_name(40, buf, sizeof(buf)), "40");
	T_EQ_STR(k3_store_plan_resident_name(K3_STORE_PLAN_RESIDENT_NONE, buf, sizeof(buf)), "none");
	T_EQ_STR(k3_store_plan_resident_name(K3_STORE_PLAN_RESIDENT_DEFAULT, buf, sizeof(buf)), "default");
	T_EQ_INT(k3_store_plan_parse_resident("-1", &r, &err), -EINVAL);
	T_EQ_INT(k3_store_plan_parse_resident("some", &r, &err), -EINVAL);
	T_EQ_INT(k3_store_plan_parse_resident("257", &r, &err), -EINVAL);
}

int main(void)
{
	struct k3_model_config c;
	char path[4096];
	const char *root = getenv("K3_SOURCE_ROOT");

	snprintf(path, sizeof(path), "%s/tests/store/k3-config/config.json", root ? root : ".");
	T_EQ_INT(load_config(path, &c), 0);
	T_EQ_INT(c.num_hidden_layers, 93);
	T_EQ_INT(c.n_kda, 69);
	T_EQ_INT(c.n_moe, 92);
	k3_tiers(&c);
	k3_plans(&c);
	small_plans();
	spellings();
	static const char *const golden[] = { "k3tiny_a", "k3tiny_b" };
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/golden/forward/%s/model",
			 getenv("K3_SHARED") ? getenv("K3_SHARED") : "../shared", golden[i]);
		measured_equals_config(path);
	}
	return t_done();
}
