"""The shipped default pair (kdtree_numba/default_model/): it loads, its files are the ones MODEL_CARD.md hashes, the
tokenizer round-trips the held-out prompts, greedy DDTree and the chain equal greedy decoding with the trained
drafter (NumPy backend: the suite's default simulator is too slow for a 9 M-parameter model), and it stays small."""
import json
import os

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.train import card

MODEL_DIR = card.DEFAULT_DIR
MAX_BYTES = 25 * 1000 * 1000


def _openblas_thread_controls():
    """(get, set) pairs of the OpenBLAS libraries loaded in this process (NumPy's bundled one included)."""
    import ctypes

    try:
        with open("/proc/self/maps") as f:
            paths = sorted({ln.split()[-1] for ln in f if "openblas" in ln.lower() and "/" in ln})
    except OSError:
        return []
    out = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("openblas", "64_"), ("openblas", ""),
                               ("scipy_openblas", "")):
            get, set_ = f"{prefix}_get_num_threads{suffix}", f"{prefix}_set_num_threads{suffix}"
            if hasattr(lib, get) and hasattr(lib, set_):
                out.append((getattr(lib, get), getattr(lib, set_)))
                break
    return out


@pytest.fixture(scope="module")
def one_blas_thread():
    """One BLAS thread while this module runs: on a busy 2-core machine OpenBLAS's thread pool made the small
    GEMMs of this model ~10x slower (measured 92 s instead of 9 s for one generation test)."""
    controls = _openblas_thread_controls()
    saved = [get() for get, _ in controls]
    for _, set_ in controls:
        set_(1)
    yield
    for (_, set_), n in zip(controls, saved):
        set_(n)


@pytest.fixture(scope="module")
def pair(one_blas_thread):
    with kd.backend.use("numpy"):
        yield kd.load_default()


@pytest.fixture(scope="module")
def prompts():
    with open(os.path.join(MODEL_DIR, "humaneval_prompts.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_loads(pair):
    target, drafter = pair
    assert target.config.vocab_size == 4096 and target.tokenizer is not None
    assert drafter.depth == 15 and drafter.vocab_size == target.config.vocab_size


def test_files_match_the_model_card():
    with open(os.path.join(MODEL_DIR, card.CARD), encoding="utf-8") as f:
        table = card.parse_hash_table(f.read())
    files = card.shipped_files(MODEL_DIR)
    assert sorted(table) == files, ("MODEL_CARD.md's hash table and the shipped files differ; regenerate the card "
                                    "with `python -m kdtree_numba.train.card`")
    for rel in files:
        assert card.sha256_file(os.path.join(MODEL_DIR, rel)) == table[rel], f"{rel}: sha256 differs from the card"


def test_size_limit():
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, fs in os.walk(MODEL_DIR) for f in fs)
    assert total <= MAX_BYTES, f"default_model/ holds {total} bytes, more than {MAX_BYTES}"


def test_tokenizer_round_trips_heldout_prompts(pair, prompts):
    tok = pair[0].tokenizer
    assert len(prompts) == 164
    for p in prompts:
        ids = tok.encode(p["prompt"])
        assert all(0 <= i < 4096 for i in ids)
        assert tok.decode(ids) == p["prompt"], p["task_id"]


@pytest.mark.parametrize("index", [0, 23])
def test_greedy_ddtree_and_chain_equal_autoregressive(pair, prompts, index):
    target, drafter = pair
    ids = np.asarray(target.tokenizer.encode(prompts[index]["prompt"]), np.int32)
    with kd.backend.use("numpy"):
        ar = kd.generate(target, ids, 32)
        tree = kd.generate(target, ids, 32, drafter=drafter, budget=16)
        chain = kd.generate(target, ids, 32, drafter=drafter, chain=True)
    assert len(ar.tokens) == 32
    assert tree.tokens == ar.tokens
    assert chain.tokens == ar.tokens
    assert tree.target_forwards < ar.target_forwards            # the trained drafter does get tokens accepted


@pytest.mark.parametrize("speed_keep, interleaved", [(4, True), (1, False)])
def test_eval_speed_passes_interleave_when_programs_stay(pair, prompts, monkeypatch, speed_keep, interleaved):
    """eval_humaneval's speed part times pass r of every method before pass r + 1 (drift falls on all alike, the
    speedup is the median per-pass ratio) - unless the model objects keep fewer replay programs than the methods
    built, when a pass would capture again and the methods run one after another, each after its own warm-up.
    The speed part raises the programs kept to SPEED_KEEP for its run (and puts KEEP back)."""
    from kdtree_numba.decode import replay
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(MODEL_DIR), "..", "benchmarks"))
    import eval_humaneval as ev

    monkeypatch.setattr(replay, "KEEP", 1)             # too few for the 3 replayed methods on their own
    monkeypatch.setattr(ev, "SPEED_KEEP", speed_keep)
    target, drafter = pair
    for model in (target, drafter):
        vars(model).pop("_programs", None)
    with kd.backend.use("numpy"):
        res = ev.run_speed(kd, target, drafter, prompts[:1], 2, [4], replay=True, repeats=2)
    assert res["interleaved"] is interleaved
    assert replay.KEEP == 1
    methods = res["methods"]
    assert set(methods) == {"autoregressive", "chain", "ddtree@4", "autoregressive (replay)", "chain (replay)",
                            "ddtree@4 (replay)"}
    for v in methods.values():
        assert len(v["tokens_per_second_passes"]) == 2 and v["mismatches_vs_autoregressive"] == 0
        assert len(v["speedup_vs_autoregressive_passes"]) == (2 if interleaved else 1)
    assert methods["autoregressive"]["speedup_vs_autoregressive"] == 1.0
    for name, v in methods.items():       # against the baselines of the method's own launch mode
        mode = " (replay)" if "replay" in name else ""
        ar, chain = methods["autoregressive" + mode], methods["chain" + mode]
        for base, key in ((ar, "speedup_vs_autoregressive_same_mode"), (chain, "speedup_vs_chain_same_mode")):
            want = np.median([x / y for x, y in zip(v["tokens_per_second_passes"], base["tokens_per_second_passes"])]) \
                if interleaved else v["tokens_per_second"] / base["tokens_per_second"]
            assert v[key] == pytest.approx(want)
        assert (v["speedup_vs_autoregressive_same_mode"] == 1.0) == name.startswith("autoregressive")
        assert (v["speedup_vs_chain_same_mode"] == 1.0) == name.startswith("chain")
    text = ev.markdown({"speed": res})
    assert ("passes interleaved" if interleaved else "one after another") in text
    assert "vs chain, same launches" in text
    for v in methods.values():           # the prefill left out of the seconds: at least the wall-clock rate
        assert v["tokens_per_second_after_prefill"] >= v["tokens_per_second"]
        assert v["ms_before_clock_mean"] == pytest.approx(1e3 * sum(v["seconds"]) / len(v["seconds"]) -
                                                          1e3 * sum(v["tokens"]) / v["tokens_per_second_after_prefill"]
                                                          / len(v["seconds"]))
        assert v["ms_before_clock_mean"] > 0


def test_eval_refuses_a_speed_subset_beyond_the_prompts(monkeypatch, capsys):
    """--speed-subset K with fewer prompts evaluated would time fewer than K quietly: one line, exit 2, no work."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(MODEL_DIR), "..", "benchmarks"))
    import eval_humaneval as ev

    assert ev.main(["--prompts", "3", "--speed-subset", "5", "--skip-tau", "--skip-bpb"]) == 2
    err = capsys.readouterr().err
    assert "--speed-subset 5: only 3 prompts" in err and "[speed]" not in err


def test_eval_sampled_acceptance(pair, prompts, monkeypatch, capsys, tmp_path):
    """--temperature T samples the acceptance and speed parts (prompt i with seed --seed + i) and still holds
    every chain / DDTree output to plain decoding's, token for token; it refuses to go with bits per byte (which
    do not sample) and a negative or non-finite T - one line, exit 2."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(MODEL_DIR), "..", "benchmarks"))
    import eval_humaneval as ev

    assert ev.main(["--prompts", "1", "--temperature", "0.8"]) == 2
    assert "--temperature 0.8: bits per byte do not depend on it; add --skip-bpb" in capsys.readouterr().err
    for bad in ("-1", "nan", "hot"):
        with pytest.raises(SystemExit):
            ev.build_parser().parse_args(["--temperature", bad])
    out = tmp_path / "sampled.json"
    with kd.backend.use("numpy"):
        rc = ev.main(["--prompts", "2", "--max-new-tokens", "12", "--budgets", "8", "--workers", "0", "--temperature",
                      "1.2", "--seed", "7", "--skip-bpb", "--skip-speed", "--out", str(out)])
    assert rc == 0
    res = json.load(open(out))
    assert res["settings"]["temperature"] == 1.2 and res["tau"]["temperature"] == 1.2 and res["tau"]["seed"] == 7
    assert res["tau"]["mismatches_total"] == 0
    target = pair[0]
    with kd.backend.use("numpy"):
        plain = kd.generate(target, target.tokenizer.encode(prompts[0]["prompt"]), 12, temperature=1.2, seed=7).tokens
    assert res["tau"]["per_prompt"][0]["ar_tokens"] == plain                  # prompt 0 sampled with seed 7 + 0
    assert "tokens sampled at T = 1.2 (seeds 7 + prompt index)" in res["markdown"]
    with kd.backend.use("numpy"):
        speed = ev.run_speed(kd, target, pair[1], prompts[:1], 12, [8], repeats=1, temperature=1.2, seed=7)
    assert speed["temperature"] == 1.2 and speed["seed"] == 7
    assert all(v["mismatches_vs_autoregressive"] == 0 for v in speed["methods"].values())


def test_eval_speed_replay_only(pair, prompts, monkeypatch):
    """--replay-only times only the replay=True methods; the speedups are against replayed autoregressive decoding
    and every output is still compared with it."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(MODEL_DIR), "..", "benchmarks"))
    import eval_humaneval as ev

    assert ev.build_parser().parse_args(["--replay-only"]).replay_only
    target, drafter = pair
    with kd.backend.use("numpy"):
        res = ev.run_speed(kd, target, drafter, prompts[:1], 2, [4], repeats=1, replay_only=True)
    methods = res["methods"]
    assert list(methods) == ["autoregressive (replay)", "chain (replay)", "ddtree@4 (replay)"]
    ar = methods["autoregressive (replay)"]
    assert ar["speedup_vs_autoregressive"] == 1.0
    for v in methods.values():
        assert v["mismatches_vs_autoregressive"] == 0
        assert v["speedup_vs_autoregressive"] == pytest.approx(v["tokens_per_second"] / ar["tokens_per_second"])


def test_eval_of_another_drafter_with_replayed_tau(pair, prompts, monkeypatch, tmp_path, capsys):
    """eval_humaneval.py --drafter DIR --replay-tau: the acceptance part with a named drafter directory (here the
    shipped one, by its path) and replay=True generations; the JSON and the markdown name the drafter; a directory
    without a config.json is refused before anything runs (exit 2)."""
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(MODEL_DIR), "..", "benchmarks"))
    import eval_humaneval as ev

    out, direct = tmp_path / "eval.json", tmp_path / "direct.json"
    common = ["--prompts", "2", "--budgets", "4,8", "--max-new-tokens", "6", "--skip-bpb", "--skip-speed",
              "--workers", "0"]
    with kd.backend.use("numpy"):
        rc = ev.main(common + ["--replay-tau", "--drafter", os.path.join(MODEL_DIR, "drafter"), "--out", str(out)])
        assert ev.main(common + ["--out", str(direct)]) == 0                    # prompt by prompt, direct
    assert rc == 0
    res = json.loads(out.read_text())
    # method by method (replayed) and prompt by prompt (direct): the same rounds and tokens for every prompt
    assert res["tau"]["per_prompt"] == json.loads(direct.read_text())["tau"]["per_prompt"]
    assert res["settings"]["drafter"] == os.path.abspath(os.path.join(MODEL_DIR, "drafter"))
    assert res["tau"]["replay"] is True and res["tau"]["mismatches_total"] == 0
    assert res["tau"]["methods"]["ddtree@4"]["rounds"] > 0
    assert "(not the shipped one)" in res["markdown"] and "greedy tokens, replayed" in res["markdown"]
    with pytest.raises(SystemExit) as e:
        ev.main(["--drafter", str(tmp_path)])
    assert e.value.code == 2 and "holds no config.json" in capsys.readouterr().err
    # an --out that cannot be written is refused before the work (a FileNotFoundError after it before)
    assert ev.main(common + ["--out", "/proc/kdtree_eval.json"]) == 2
    assert "--out /proc/kdtree_eval.json: cannot write in /proc" in capsys.readouterr().err
