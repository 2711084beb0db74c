"""The model-card generator on a fake default_model directory: the hash table it writes matches the files, the
numbers come from the inputs, the GPU section is filled only from a GPU eval JSON, the CLI's errors."""
import hashlib
import json
import os
import struct

import pytest

from kdtree_numba.train import card


def _safetensors(path, tensors):
    """A valid safetensors file: ``tensors`` = {name: shape}, bf16 zeros."""
    header, off = {}, 0
    for name, shape in tensors.items():
        n = 2
        for s in shape:
            n *= s
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + bytes(off))


def _write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        if isinstance(obj, str):
            f.write(obj)
        else:
            json.dump(obj, f)


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


TCFG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "transformers_version": "5.0",
        "num_hidden_layers": 2, "first_k_dense_replace": 1, "hidden_size": 8, "intermediate_size": 16,
        "num_attention_heads": 2, "q_lora_rank": 4, "kv_lora_rank": 4, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2,
        "v_head_dim": 2, "n_routed_experts": 2, "num_experts_per_tok": 1, "n_shared_experts": 1,
        "moe_intermediate_size": 4, "vocab_size": 16, "max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "eos_token_id": 0, "pad_token_id": 2,
        "num_nextn_predict_layers": 1}
DCFG = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
        "rope_theta": 10000.0, "vocab_size": 16, "block_size": 4,
        "dflash_config": {"target_layer_ids": [0], "mask_token_id": 1}}


def _fake_dir(root):
    d = str(root / "default_model")
    _write(os.path.join(d, "target", "config.json"), TCFG)
    _write(os.path.join(d, "target", "tokenizer.json"), '{"fake": "tokenizer"}')
    _safetensors(os.path.join(d, "target", "model-00001-of-00001.safetensors"),
                 {"model.embed_tokens.weight": (16, 8), "model.layers.1.mlp.gate.e_score_correction_bias": (2,)})
    _write(os.path.join(d, "drafter", "config.json"), DCFG)
    _safetensors(os.path.join(d, "drafter", "model.safetensors"), {"fc.weight": (8, 8)})
    _write(os.path.join(d, "humaneval_prompts.jsonl"), '{"task_id": "HumanEval/0", "prompt": "def f():\\n"}\n')
    _write(os.path.join(d, "training_curves.png"), "not really a png")
    tok_sha = _sha(os.path.join(d, "target", "tokenizer.json"))
    held_sha = _sha(os.path.join(d, "humaneval_prompts.jsonl"))
    _write(os.path.join(d, "corpus_manifest.json"), {
        "wheels": [{"name": "toolz", "version": "9.9.9", "sha256": "ab" * 32}], "files": 7,
        "dropped": ["toolz-9.9.9/x.py"], "bytes": 3000, "tokens": 1000,
        "sha256": {"tokenizer.json": tok_sha, "heldout.jsonl": held_sha}, "heldout": "fake held-out note"})
    _write(os.path.join(d, "target_train_log.json"), {
        "args": {"data_dir": "D", "out_dir": "O/target", "steps": 12, "batch": 2, "seq": 32, "lr": 0.002, "seed": 0,
                 "val_every": 500, "weight_decay": 0.1, "warmup_frac": 0.04, "final_lr_frac": 0.1, "grad_clip": 1.0,
                 "log_every": 50, "val_windows": 4},
        "params": 128, "device": "cuda", "versions": {"gpu": "Fake GPU 9000", "torch": "2", "transformers": "5"},
        "implementation": {"attn": "sdpa", "experts": "grouped_mm"}, "steps": [{"step": 12, "loss": 3.25}],
        "val": [{"step": 12, "loss": 3.5}], "train_seconds": 1.5, "ms_per_step": 125.0, "total_seconds": 2.0})
    _write(os.path.join(d, "drafter_train_log.json"), {
        "config": {"block_size": 4},
        "args": {"data_dir": "D", "target_dir": "O/target", "out_dir": "O/drafter", "steps": 3000, "batch": 32,
                 "anchors": 64, "block": 16, "layers": 2, "target_layers": [1, 2, 3], "lr": 0.0006, "regen": 2048,
                 "regen_prompt": 64, "regen_batch": 1024, "regen_max_seconds": 90.0, "val_every": 1000, "seq": 512},
        "params": 64, "gamma": 7.0,
        "regen": {"train_sequences": 8, "val_sequences": 4, "prompt_tokens": 4, "new_tokens": 28, "batch": 12,
                  "seconds": 0.5, "new_tokens_per_s": 100.0, "capped": False},
        "target_implementation": {"attn": "sdpa", "experts": "eager"}, "versions": {"gpu": "Fake GPU 9000"},
        "val": [{"step": 10, "corpus": {"loss": 4.0, "acc": [0.5, 0.25, 0.125], "mean_acc": 0.3, "chain_accept": 1.5},
                 "regen": {"loss": 3.0, "acc": [0.75, 0.5, 0.25], "mean_acc": 0.5, "chain_accept": 2.5}}],
        "train_seconds": 3.0, "ms_per_step": 0.3, "total_seconds": 4.0})
    return d


def _eval(backend="numpy", device="CPU: Fake", tps=(100.0, 50.0, 40.0)):
    methods = {"chain": {"tau": 1.875, "tau_prompt_mean": 1.9, "forwards_per_token": 0.55, "rounds": 10,
                         "mismatches": 0},
               "ddtree@8": {"tau": 2.125, "tau_prompt_mean": 2.2, "forwards_per_token": 0.45, "rounds": 9,
                            "mismatches": 0},
               "autoregressive": {"forwards_per_token": 1.0}}
    speed = {"autoregressive": tps[0], "chain": tps[1], "ddtree@8": tps[2]}
    return {"command": f"KDTREE_BACKEND={backend} python benchmarks/eval_humaneval.py", "date": "2026-01-01",
            "package_version": "0.1.0", "backend": backend, "device": device, "prompts": 2, "blas_threads": 1,
            "task_ids": ["HumanEval/0", "HumanEval/1"], "settings": {"max_new_tokens": 16},
            "bpb": {"bits_per_byte": 1.2345, "nats_per_token": 2.5, "bits_per_token": 3.6, "bytes_per_token": 3.1,
                    "bits_per_byte_prompt_mean": 1.3, "roundtrip_failures": 0, "prompts": 2, "definition": "DEF"},
            "tau": {"definition": "TAU-DEF", "backend": "numpy", "workers": 2, "prompts": 2, "budgets": [8],
                    "mismatches_total": 0, "methods": methods},
            "speed": {"definition": "SPEED-DEF", "task_ids": ["HumanEval/0"], "max_new_tokens": 16, "budget": 8,
                      "backend": backend, "device": device,
                      "methods": {k: {"tokens_per_second": v, "speedup_vs_autoregressive": v / tps[0],
                                      "median_generation_seconds": 0.1} for k, v in speed.items()}}}


def test_card_hash_table_matches_files(tmp_path):
    d = _fake_dir(tmp_path)
    ev = tmp_path / "eval.json"
    ev.write_text(json.dumps(_eval()))
    path = card.write_card(d, str(ev))
    assert path == os.path.join(d, card.CARD)
    text = open(path).read()
    table = card.parse_hash_table(text)
    files = card.shipped_files(d)
    assert card.CARD not in table and sorted(table) == files
    for rel in files:
        assert table[rel] == _sha(os.path.join(d, rel)), rel
    assert "training_curves.png" in table and "](training_curves.png)" in text


def test_card_numbers_come_from_the_inputs(tmp_path):
    d = _fake_dir(tmp_path)
    text = card.build_card(d, _eval())
    assert "1.2345 bits per byte" in text                       # eval bpb
    assert "**1.875**" in text and "**2.125**" in text           # tau of the chain and of DDTree@8
    assert "Fake GPU 9000" in text and "3.5000" in text          # training log: GPU, final validation loss
    assert "toolz | 9.9.9" in text and "`" + "ab" * 32 + "`" in text      # manifest wheels
    assert "`toolz-9.9.9/x.py`" in text                         # dropped files
    assert "128 parameters + 2 elements of router-bias buffers" in text   # from the safetensors headers
    assert "--steps 12 --batch 2 --seq 32" in text              # non-default flags rebuilt into the command
    assert "`tokenizer.json`: yes" in text
    assert "Not yet measured" in text.split(card.GPU_HEADING)[1].split("## ")[0]


def test_card_gpu_section_from_gpu_eval(tmp_path):
    d = _fake_dir(tmp_path)
    gpu = _eval(backend="cuda", device="NVIDIA H200", tps=(500.0, 900.0, 1234.5))
    text = card.build_card(d, _eval(), gpu)
    section = text.split(card.GPU_HEADING)[1].split("\n## ")[0]
    assert "NVIDIA H200" in section and "1234.5" in section and "Not yet measured" not in section
    assert "same launches" not in section                       # an eval from before the same-mode ratios
    for v in gpu["speed"]["methods"].values():                 # one that reports them: two more columns
        v["speedup_vs_autoregressive_same_mode"], v["speedup_vs_chain_same_mode"] = 1.25, 1.5
    section = card.build_card(d, _eval(), gpu).split(card.GPU_HEADING)[1].split("\n## ")[0]
    assert "| vs autoregressive, same launches | vs chain, same launches |" in section
    assert "| 1.25x | 1.50x |" in section


def test_card_without_eval_and_tampered_file(tmp_path):
    d = _fake_dir(tmp_path)
    text = card.build_card(d, None)
    assert "Not yet measured" in text
    table = card.parse_hash_table(text)
    with open(os.path.join(d, "drafter", "config.json"), "a") as f:
        f.write(" ")
    assert table["drafter/config.json"] != _sha(os.path.join(d, "drafter", "config.json"))


def test_card_decodes_the_continuations(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    d = _fake_dir(tmp_path)
    real = os.path.join(card.DEFAULT_DIR, "target", "tokenizer.json")
    with open(real, "rb") as src, open(os.path.join(d, "target", "tokenizer.json"), "wb") as dst:
        dst.write(src.read())
    tok = tokenizers.Tokenizer.from_file(real)
    texts = ["\n    return 1\n", "\nimport os\nimport os\nimport os\n", "\nx = 1\n"]
    ev = _eval()
    ev["tau"]["per_prompt"] = [{"task_id": f"HumanEval/{i}", "ar_tokens": tok.encode(t).ids}
                               for i, t in enumerate(texts)]
    stats = card.continuation_stats(ev, d)
    assert (stats["n"], stats["body"], stats["repeat"], stats["sample"]) == (3, 1, 1, texts[0])
    text = card.build_card(d, ev)
    assert "**1** start a function body" in text and "    return 1" in text
    assert card.continuation_stats(_eval(), d) is None            # no per-prompt tokens: no samples section


def test_parse_hash_table_needs_the_section():
    with pytest.raises(ValueError, match="Files and sha256"):
        card.parse_hash_table("# a card\nno table\n")


def test_card_cli(tmp_path, capsys):
    d = _fake_dir(tmp_path)
    out = tmp_path / "CARD.md"
    assert card.main(["--model-dir", d, "--out", str(out)]) == 0
    assert card.parse_hash_table(out.read_text())
    assert card.main(["--model-dir", d, "--eval", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    not_json = tmp_path / "notes.md"
    not_json.write_text("# not JSON\n")
    assert card.main(["--model-dir", d, "--eval", str(not_json), "--out", str(out)]) == 2
    assert f"card: error: {not_json}: not a JSON file (Expecting value" in capsys.readouterr().err
    assert card.parse_hash_table(out.read_text())                      # the card written before is intact
    assert card.main(["--model-dir", str(tmp_path)]) == 2
    before = out.read_text()
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    for argv, msg in ((["--out", ""], "--out '': expected a file path"),                    # was: the default card
                      (["--out", str(tmp_path)], "a folder, expected a file path"),
                      (["--out", str(tmp_path / "no" / "c.md")], "does not exist"),
                      (["--eval", str(empty), "--out", str(out)], "not an eval_humaneval.py JSON")):
        capsys.readouterr()
        assert card.main(["--model-dir", d] + argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (argv, err)
    assert out.read_text() == before


def test_card_refuses_an_eval_of_another_drafter(tmp_path, capsys):
    """eval_humaneval.py --drafter DIR evaluates a candidate: its numbers must not land in the shipped pair's card."""
    d = _fake_dir(tmp_path)
    ev = _eval()
    ev["settings"] = {"drafter": "/runs/drafter-regen8192"}
    path = tmp_path / "candidate.json"
    path.write_text(json.dumps(ev))
    assert card.main(["--model-dir", d, "--eval", str(path), "--out", str(tmp_path / "CARD.md")]) == 2
    err = capsys.readouterr().err
    assert "evaluates the drafter /runs/drafter-regen8192 (weights sha256 not recorded), expected the shipped" in err
    assert not (tmp_path / "CARD.md").exists()                   # nothing half-written
    ev["settings"]["drafter_sha256"] = "0" * 64                  # another drafter's weights
    path.write_text(json.dumps(ev))
    assert card.main(["--model-dir", d, "--eval", str(path), "--out", str(tmp_path / "CARD.md")]) == 2
    assert f"weights sha256 {'0' * 64}), expected the shipped" in capsys.readouterr().err
    # the candidate shipped since: its eval (same weights, by hash) serves the card
    ev["settings"]["drafter_sha256"] = card.sha256_file(os.path.join(d, "drafter", "model.safetensors"))
    path.write_text(json.dumps(ev))
    assert card.main(["--model-dir", d, "--eval", str(path), "--out", str(tmp_path / "CARD.md")]) == 0
    os.remove(tmp_path / "CARD.md")
    ev["settings"] = {"drafter": "shipped"}
    path.write_text(json.dumps(ev))
    assert card.main(["--model-dir", d, "--eval", str(path), "--out", str(tmp_path / "CARD.md")]) == 0


def _sampled(temperature=1.0):
    ev = _eval()
    for k in ("bpb", "speed"):
        del ev[k]
    ev["settings"]["temperature"] = temperature
    ev["tau"].update(temperature=temperature, seed=5, max_new_tokens=16)
    ev["tau"]["methods"]["chain"]["tau"] = 1.4375
    return ev


def test_card_sampled_acceptance_from_a_sampled_eval(tmp_path, capsys):
    """A sampled eval (eval_humaneval.py --temperature) adds its own acceptance table and glance row, and changes
    the limitation line; a greedy eval given as the sampled one (or the reverse) is refused, nothing written."""
    d = _fake_dir(tmp_path)
    text = card.build_card(d, _eval())
    assert "Acceptance when sampling" not in text and "Greedy decoding only was evaluated" in text
    text = card.build_card(d, _eval(), None, _sampled())
    section = text.split("### Acceptance when sampling (T = 1)")[1].split("\n## ")[0]
    assert "**1.438**" in section and "seed 5 + i" in section and "**0 mismatches** in 4 runs" in section
    assert "| acceptance (sampled, T = 1) | chain tau 1.44; DDTree tau 2.12 (budget 8)" in text
    assert "Sampled decoding was evaluated at T = 1 (Evaluation): acceptance only" in text
    s_path, out = tmp_path / "sampled.json", tmp_path / "CARD.md"
    s_path.write_text(json.dumps(_sampled()))
    assert card.main(["--model-dir", d, "--sampled-eval", str(s_path), "--out", str(out)]) == 0
    assert "Acceptance when sampling" in out.read_text()
    os.remove(out)
    s_path.write_text(json.dumps(_eval()))                       # a greedy eval in the sampled slot
    assert card.main(["--model-dir", d, "--sampled-eval", str(s_path), "--out", str(out)]) == 2
    assert "an eval at temperature 0, expected a sampled one" in capsys.readouterr().err
    s_path.write_text(json.dumps(_sampled()))                    # and a sampled one in the greedy slot
    assert card.main(["--model-dir", d, "--eval", str(s_path), "--out", str(out)]) == 2
    assert f"expected a greedy one (sampled evals go in {card.SAMPLED_EVAL} / {card.SAMPLED_GPU_EVAL})" in \
        capsys.readouterr().err
    assert not out.exists()


def test_card_sampled_gpu_speed(tmp_path, capsys):
    """A sampled GPU eval (eval_humaneval.py --temperature .. --skip-tau) adds its tokens/s under the GPU heading
    and, where speculation loses to plain decoding, says so; one without a speed part is refused."""
    d = _fake_dir(tmp_path)
    gpu = _eval(backend="cuda", device="NVIDIA H200", tps=(500.0, 300.0, 400.0))
    del gpu["tau"], gpu["bpb"]
    gpu["settings"]["temperature"] = 1.0
    gpu["speed"].update(temperature=1.0, seed=0)
    text = card.build_card(d, _eval(), None, _sampled(), gpu)
    section = text.split(card.GPU_HEADING)[1].split("\n## ")[0]
    assert "Sampled at T = 1 (`eval_humaneval_gpu_sampled.json`" in section and "| 0.80x |" in section
    assert "no longer pays for itself" in section
    assert "acceptance and GPU tokens/s; at that temperature speculation with this drafter is slower" in text
    path, out = tmp_path / "gpu_sampled.json", tmp_path / "CARD.md"
    del gpu["speed"]
    path.write_text(json.dumps(gpu))
    assert card.main(["--model-dir", d, "--sampled-gpu-eval", str(path), "--out", str(out)]) == 2
    assert "holds no speed part ('speed'), expected eval_humaneval.py --temperature T --skip-bpb --skip-tau" in \
        capsys.readouterr().err
    assert not out.exists()


OLD_REGEN_ROW = ("| regeneration | 8 prompts of 4 tokens from the train split (+ 4 from the validation split, held out), "
                 "each continued GREEDILY by the target for 28 tokens (HF `generate`, do_sample=False, no EOS stop), "
                 "in batches of 12: 0.5 s, 100 new tokens/s. The drafter so learns the target's own greedy behaviour, "
                 "the text it must predict at decode time |")
OLD_DRAFTER_CMD = "python -m kdtree_numba.train drafter --data D --target O/target --out O/drafter"


def _dlog_path(d):
    return os.path.join(d, "drafter_train_log.json")


def test_card_log_without_regen_docstring_renders_as_before(tmp_path):
    """A drafter log from before --regen-docstring (no key) renders the rows it always did; 0.0 renders the same."""
    d = _fake_dir(tmp_path)
    text = card.build_card(d, _eval())
    assert OLD_REGEN_ROW in text.splitlines() and OLD_DRAFTER_CMD in text.splitlines()
    assert "docstring" not in text.split("### Drafter")[1].split("## Evaluation")[0]
    dlog = json.load(open(_dlog_path(d)))
    dlog["args"]["regen_docstring"] = 0.0
    _write(_dlog_path(d), dlog)
    again = card.build_card(d, _eval())
    assert again.split(card.HASH_HEADING)[0] == text.split(card.HASH_HEADING)[0]    # the log's own hash changed


def test_shipped_card_is_what_its_files_render():
    """The card built from the shipped files is the shipped card (`train card` was run after the last change)."""
    pytest.importorskip("tokenizers")
    d = card.DEFAULT_DIR
    ev_path, gpu_path, card_path = (os.path.join(d, name) for name in (card.EVAL, card.GPU_EVAL, card.CARD))
    if not (os.path.exists(ev_path) and os.path.exists(card_path)):
        pytest.skip("the shipped eval JSON or card is missing")
    gpu = json.load(open(gpu_path)) if os.path.exists(gpu_path) else None     # the GPU eval is optional
    sampled = [json.load(open(p)) if os.path.exists(p) else None                  # and the sampled ones
               for p in (os.path.join(d, card.SAMPLED_EVAL), os.path.join(d, card.SAMPLED_GPU_EVAL))]
    assert card.build_card(d, json.load(open(ev_path)), gpu, *sampled) == open(card_path, encoding="utf-8").read()


def test_card_says_when_prompts_end_at_docstrings(tmp_path):
    d = _fake_dir(tmp_path)
    dlog = json.load(open(_dlog_path(d)))
    dlog["args"]["regen_docstring"] = 0.25
    dlog["regen"]["docstring"] = {"fraction": 0.25, "train_prompts": 2, "val_prompts": 1, "lookback": 200,
                                  "train": {"candidates": 36725, "checked": 7, "valid": 2},
                                  "val": {"candidates": 381, "checked": 3, "valid": 1}, "seconds": 0.3}
    dlog["val"][0]["regen_docstring"] = {"loss": 2.0, "acc": [0.875, 0.5, 0.25], "mean_acc": 0.54,
                                         "chain_accept": 2.25}
    _write(_dlog_path(d), dlog)
    text = card.build_card(d, _eval())
    row = next(line for line in text.splitlines() if line.startswith("| regeneration |"))
    assert row.startswith(OLD_REGEN_ROW[:-2])                                  # the old row, then the sentence
    assert ("`--regen-docstring 0.25`: 2 of the train prompts and 1 of the held-out ones end the way every "
            "HumanEval prompt does") in row
    assert "a `def` signature is followed directly by its docstring (2 valid sites among 7 checked of 36,725" in row
    assert "closing quotes token and given one bare newline token; the rest are random windows |" in row
    assert OLD_DRAFTER_CMD + " --regen-docstring 0.25" in text.splitlines()
    assert "| 10 | target-regenerated, docstring-ended prompts only | 2.0000 | 0.875 | 0.250 | 0.540 | 2.25 |" in text


def test_card_names_both_corpus_directories_when_the_runs_used_two(tmp_path):
    d = _fake_dir(tmp_path)
    assert "was named `D`):" in card.build_card(d, _eval())                 # one directory for both runs
    dlog = json.load(open(_dlog_path(d)))
    dlog["args"]["data_dir"] = "/tmp/x"
    _write(_dlog_path(d), dlog)
    assert "was named `D` for the target's run and `/tmp/x` for the drafter's):" in card.build_card(d, _eval())


def test_card_reproduce_commands_carry_the_runs_flags(tmp_path):
    """'How to reproduce' rebuilds both training commands from the logs: the recipe's directories, the run's flags
    (a drafter trained with --regen 16384 --steps 5000 is reproduced by a command that says so)."""
    d = _fake_dir(tmp_path)
    log = json.load(open(os.path.join(d, "drafter_train_log.json")))
    log["args"]["regen"] = 16384
    _write(os.path.join(d, "drafter_train_log.json"), log)
    recipe = card.build_card(d, _eval()).split("## How to reproduce")[1].split("```")[1]
    assert "python -m kdtree_numba.train target --data .corpus --out run/target --steps 12 " in recipe
    drafter = next(line for line in recipe.splitlines() if line.startswith("python -m kdtree_numba.train drafter"))
    assert drafter.startswith("python -m kdtree_numba.train drafter --data .corpus --target run/target --out run/drafter")
    assert drafter.split("   #")[0].endswith(" --regen 16384")                 # the run's flag
    assert "O/" not in recipe and " D " not in recipe                          # not the run's own directories


def test_card_names_each_runs_gpu(tmp_path):
    """One GPU for every run: "on one <GPU>"; drafter runs elsewhere: each GPU with its runs, and the runs whose
    logs (before 2026-12-05) do not name their GPU said so, in the glance table and the training section."""
    d = _fake_dir(tmp_path)
    assert "on one Fake GPU 9000" in card.build_card(d, _eval())
    log = json.load(open(os.path.join(d, "drafter_train_log.json")))
    first = dict(log["args"], seed=1)
    log["versions"] = {"gpu": "Fake GPU 100"}
    log["args"] = dict(log["args"], init="/runs/A")
    log["init"] = {"dir": "/runs/A", "sha256": "cd" * 32, "args": first, "init": {"dir": "/runs/0", "sha256": "ab" * 32,
                   "args": first, "init": None, "total_seconds": 1.0, "gpu": "Fake GPU 9000"}, "total_seconds": 2.0}
    want = "Fake GPU 9000 (the target, drafter run 1) and Fake GPU 100 (drafter run 3; run 2: GPU not recorded)"
    assert card.training_gpus(json.load(open(os.path.join(d, "target_train_log.json"))), log) == want
    _write(os.path.join(d, "drafter_train_log.json"), log)
    text = card.build_card(d, _eval())
    assert f"(3 runs in all) on {want};" in text and f"All runs on {want};" in text
    assert "on one Fake GPU" not in text


def test_card_gives_the_whole_chain_of_a_drafter_trained_from_another(tmp_path):
    """A drafter trained with --init from an earlier one: both commands, first to last, as run and as a recipe
    (run/drafter-1 feeds run/drafter); a --regen-mix other than 0.5 and --regen-anchors generated are flags and the
    training-text row says them."""
    d = _fake_dir(tmp_path)
    log = json.load(open(os.path.join(d, "drafter_train_log.json")))
    first = dict(log["args"], regen=16384)
    log["args"] = dict(log["args"], seed=1, regen_mix=0.75, regen_anchors="generated", init="/runs/E",
                       out_dir="O/drafter2")
    log["init"] = {"dir": "/runs/E", "sha256": "cd" * 32, "args": first, "init": None, "total_seconds": 400.4}
    log["total_seconds"] = 99.6
    _write(os.path.join(d, "drafter_train_log.json"), log)
    text = card.build_card(d, _eval())
    recipe = text.split("## How to reproduce")[1].split("```")[1]
    cmds = [line for line in recipe.splitlines() if line.startswith("python -m kdtree_numba.train drafter")]
    assert len(cmds) == 2
    assert "--out run/drafter-1 " in cmds[0] and "--regen 16384" in cmds[0] and "--init" not in cmds[0]
    assert cmds[0].endswith("   # 400 s") and cmds[1].endswith("   # 100 s")              # each run's own time
    assert card.drafter_seconds(log) == (500.0, 2) and "drafter 500 s (2 runs in all)" in text
    assert "in 2 runs, each from the weights of the one before" in text
    assert "--out run/drafter " in cmds[1] and cmds[1].split("   #")[0].endswith(" --init run/drafter-1")
    assert "--seed 1" in cmds[1] and "--regen-mix 0.75" in cmds[1] and "--regen-mix" not in cmds[0]
    assert "--regen-anchors generated" in cmds[1] and "--regen-anchors" not in cmds[0]     # E's log lacks the key
    as_run = text.split("## Training")[1].split("```")[1]
    assert "--out O/drafter2" in as_run and f"--init /runs/E   # weights sha256 {'cd' * 6}.." in as_run
    assert "is 8 corpus windows (train split, random offsets) and 24 text the target generated" in text
    assert "start in the generated part only, from position" in text
    log["init"] = {"dir": "/w", "sha256": "ef" * 32, "args": None, "init": None}           # weights without a log
    _write(os.path.join(d, "drafter_train_log.json"), log)
    recipe = card.build_card(d, _eval()).split("## How to reproduce")[1].split("```")[1]
    assert f"# starting weights: model.safetensors sha256 {'ef' * 32} (no training log)" in recipe
    assert "--init DIR" in recipe


def test_card_says_which_share_of_the_drafters_text_was_sampled(tmp_path):
    """A drafter log with --regen-sampled: the command carries the flag, the regeneration row says how many sequences
    were sampled at temperature 1 and the rest greedily, and the held-out sampled rows get their own metrics row;
    without the flag the row says GREEDILY (the shipped card's wording)."""
    d = _fake_dir(tmp_path)
    plain = card.build_card(d, _eval())
    assert "continued GREEDILY by the target" in plain and "--regen-sampled" not in plain
    log = json.load(open(os.path.join(d, "drafter_train_log.json")))
    log["args"] = dict(log["args"], regen_sampled=0.5)
    log["regen"] = dict(log.get("regen") or {}, sampled_sequences=6)
    row = {"loss": 3.0, "acc": [0.4, 0.2, 0.1], "mean_acc": 0.25, "chain_accept": 1.4}
    log["val"] = [dict(log["val"][0], regen_sampled=row)]
    _write(os.path.join(d, "drafter_train_log.json"), log)
    text = card.build_card(d, _eval())
    assert "--regen-sampled 0.5" in text and "GREEDILY" not in text
    assert "so 6 of the sequences (train and held-out alike) SAMPLED from its distribution at temperature 1" in text
    assert "| 10 | target-regenerated, sampled rows only | 3.0000 | 0.400 |" in text
