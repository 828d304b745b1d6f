"""export - writes a k3torch model as a checkpoint in the release's exact
Hugging Face layout (the layout daemon/model/demo.c writes and
tests/model/test_demo.c checks against the goldens):

  config.json                    kimi_k3 + text_config + quantization_config
  model.safetensors.index.json   sorted weight_map, metadata.total_size
  model-0000N-of-00002.safetensors
                                 layers split evenly (the remainder to the
                                 first shard), the embedding in the first,
                                 lm_head and the final norms in the last;
                                 inside a shard F32 first, then BF16, then
                                 U8, each by name; header space-padded to 8
  tiktoken.model, tokenizer_config.json   (bpe.Tokenizer.write)

dtypes as the release stores them: F32 A_log ([max(head_dim, heads)], the
live heads then zeros), dt_bias, conv taps, o_norm, e_score_correction_bias;
BF16 every other matrix and norm; U8 MXFP4 experts (weight_packed +
weight_scale). Every value written is the one the QAT forward pass used
(bfloat16 round-to-nearest-even, k3torch.mxfp4_encode), so the checkpoint
computes what the trained model computed. Same model -> same bytes.
"""
import json
import os
import struct

import torch

import k3torch

F32_SUFFIX = ("self_attn.A_log", "self_attn.dt_bias", "_conv1d.weight", "self_attn.o_norm.weight",
              "gate.e_score_correction_bias")


def tensors(m):
    """[(name, dtype, shape, bytes)] of the checkpoint, release names."""
    cfg = m.cfg
    out = []
    for n, p in m.state_dict().items():
        p = p.detach().to(torch.float32).cpu()
        if ".experts_w" in n:
            head, w = n.split(".experts_")
            for e in range(p.shape[0]):
                codes, sc = k3torch.mxfp4_encode(p[e])
                base = "%s.experts.%d.%s." % (head, e, w)
                pk = k3torch.mxfp4_pack(codes)
                out.append((base + "weight_packed", "U8", list(pk.shape), pk.numpy().tobytes()))
                out.append((base + "weight_scale", "U8", list(sc.shape), sc.contiguous().numpy().tobytes()))
            continue
        if n.endswith(F32_SUFFIX):
            if n.endswith("A_log"):
                full = torch.zeros(max(cfg.dk, cfg.Hk))
                full[: cfg.Hk] = p
                p = full
            out.append((n, "F32", list(p.shape), p.contiguous().numpy().astype("<f4").tobytes()))
        else:
            b = p.to(torch.bfloat16).contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
            out.append((n, "BF16", list(p.shape), b))
    return [(k3torch.PREFIX + n, dt, s, b) for n, dt, s, b in out]


def shard_of(name, L, n_shards=2):
    last = n_shards - 1
    if ".layers." not in name:
        return 0 if "embed_tokens" in name else last
    layer = int(name.split(".layers.")[1].split(".")[0])
    base, rem = divmod(L, n_shards)
    acc = 0
    for s in range(n_shards):
        acc += base + (s < rem)
        if layer < acc:
            return s
    return last


DT_SIZE = {"F32": 4, "BF16": 2, "U8": 1}


def write_shard(path, items):
    items = sorted(items, key=lambda t: (-DT_SIZE[t[1]], t[0]))
    hdr = {"__metadata__": {"format": "pt"}}
    off = 0
    for n, dt, s, b in items:
        hdr[n] = {"dtype": dt, "shape": s, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, b in items:
            f.write(b)
    return off


def config(m, tok, note):
    c = m.cfg
    ranks = tok.n_ranks
    kda = [l + 1 for l in range(c.L) if c.is_kda(l)]
    full = [l + 1 for l in range(c.L) if not c.is_kda(l)]
    quant = {
        "config_groups": {"group_0": {
            "format": "mxfp4-pack-quantized", "input_activations": None, "output_activations": None,
            "targets": ["Linear"],
            "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32,
                        "num_bits": 4, "observer": "minmax", "observer_kwargs": {},
                        "scale_dtype": "torch.uint8", "strategy": "group", "symmetric": True,
                        "type": "float", "zp_dtype": None}}},
        "format": "mxfp4-pack-quantized", "global_compression_ratio": None,
        "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                   "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"],
        "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed",
    }
    tc = {
        "activation_situ_beta": c.beta1, "activation_situ_linear_beta": c.beta2,
        "architectures": ["KimiLinearForCausalLM"], "attn_res_block_size": c.S,
        "bos_token_id": ranks, "dtype": "bfloat16", "eos_token_id": ranks + 2,
        "first_k_dense_replace": c.first_dense, "hidden_act": "situ", "hidden_size": c.D,
        "initializer_range": 0.02, "intermediate_size": c.inter, "kv_lora_rank": c.kv_lora,
        "latent_moe_use_norm": True,
        "linear_attn_config": {"full_attn_layers": full, "gate_lower_bound": c.lower, "head_dim": c.dk,
                               "kda_layers": kda, "num_heads": c.Hk, "short_conv_kernel_size": c.conv_k,
                               "use_full_rank_gate": True},
        "max_position_embeddings": 1048576, "mla_use_nope": True, "mla_use_output_gate": True,
        "model_type": "kimi_linear", "moe_intermediate_size": c.moe_inter, "moe_layer_freq": c.freq,
        "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "num_attention_heads": c.Hm,
        "num_expert_group": 1, "num_experts": c.E, "num_experts_per_token": c.K,
        "num_hidden_layers": c.L, "num_key_value_heads": c.Hm, "num_nextn_predict_layers": 0,
        "num_shared_experts": c.n_shared, "pad_token_id": ranks + 255, "q_lora_rank": c.q_lora,
        "qk_nope_head_dim": c.nope, "qk_rope_head_dim": c.rope, "quantization_config": quant,
        "rms_norm_eps": c.eps, "rope_theta": 10000.0, "routed_expert_hidden_size": c.latent,
        "routed_scaling_factor": c.rscale, "tie_word_embeddings": False, "topk_group": 1,
        "topk_method": "noaux_tc", "use_cache": True, "use_grouped_topk": True, "v_head_dim": c.vh,
        "vocab_size": c.vocab,
    }
    return {
        "architectures": ["KimiK3ForConditionalGeneration"], "bos_token_id": ranks, "dtype": "bfloat16",
        "eos_token_id": ranks + 2, "media_placeholder_token_id": ranks + 21, "model_type": "kimi_k3",
        "pad_token_id": ranks + 255, "text_config": tc, "tie_word_embeddings": False,
        "k3_demo_model": note,
    }


def dump_json(path, obj):
    with open(path, "w", newline="\n") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def export(m, tok, out, note):
    """Writes the checkpoint into directory out; returns the file names."""
    os.makedirs(out, exist_ok=True)
    items = tensors(m)
    n_shards = 2
    wmap = {}
    total = 0
    names = []
    for s in range(n_shards):
        fn = "model-%05d-of-%05d.safetensors" % (s + 1, n_shards)
        mine = [t for t in items if shard_of(t[0], m.cfg.L, n_shards) == s]
        total += write_shard(os.path.join(out, fn), mine)
        for t in mine:
            wmap[t[0]] = fn
        names.append(fn)
    dump_json(os.path.join(out, "model.safetensors.index.json"),
              {"metadata": {"total_size": total}, "weight_map": wmap})
    dump_json(os.path.join(out, "config.json"), config(m, tok, note))
    tok.write(out)
    return sorted(names + ["model.safetensors.index.json", "config.json", "tiktoken.model",
                           "tokenizer_config.json"])
