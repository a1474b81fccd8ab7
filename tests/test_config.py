"""Config: checked when built (field and allowed values in the message), hashable, tiers in one place."""
from __future__ import annotations

from dataclasses import replace

import pytest

from edge_rag.config import DEFAULT_TIERS, GATES, TIERS, Config, Tier, TierSpec
from edge_rag.decision import gate
from edge_rag.errors import ConfigError, EdgeRAGError


@pytest.mark.parametrize("changes, message", [
    ({"gate": "Betting"}, "gate='Betting': allowed values are none, distance, hoeffding, azuma, bernstein, betting"),
    ({"passage_mode": "page"}, "passage_mode='page': allowed values are sentence, paragraph"),
    ({"gate_delta": 0.0}, "gate_delta=0.0: allowed values are a number > 0.0 and < 1.0"),
    ({"gate_threshold": 1.2}, "gate_threshold=1.2: allowed values are a number >= 0.0 and <= 1.0"),
    ({"refuse_distance": 5}, "refuse_distance=5: allowed values are a number >= 0.0 and <= 4.0"),
    ({"temperature": float("nan")}, "temperature=nan: allowed values are a number >= 0.0"),
    ({"memory_budget_mb": 0}, "memory_budget_mb=0: allowed values are an integer >= 1"),
    ({"hnsw_m": 16.5}, "hnsw_m=16.5: allowed values are an integer >= 2"),
    ({"cache_size": True}, "cache_size=True: allowed values are an integer >= 0"),
    ({"router": "yes"}, "router='yes': allowed values are True, False"),
    ({"fallback_tier": "HUGE"}, "fallback_tier='HUGE': allowed values are EASY, MEDIUM, HARD"),
    ({"tier_override": "easy"}, "tier_override='easy': allowed values are EASY, MEDIUM, HARD"),
    ({"tiers": {Tier.EASY: DEFAULT_TIERS[Tier.EASY]}}, "allowed values map each of EASY, MEDIUM, HARD to a TierSpec"),
    # llama.cpp read -1 (and 2**32 - 1) as "a random seed": answers at temperature > 0 changed from run to run
    ({"seed": -1}, "seed=-1: allowed values are an integer >= 0 and <= 4294967294"),
    ({"seed": 2**32 - 1}, "seed=4294967295: allowed values are an integer >= 0 and <= 4294967294"),
    # each question listed the 2 x reader_window + 1 passage ids around its hit: 10**9 ran the process out of memory
    ({"reader_window": 10**9}, "reader_window=1000000000: allowed values are an integer >= 0 and <= 1000"),
    # counts reach SQLite's LIMIT and hnswlib: baseline_k (gate_max_n, correction_extra_k) 2**63 was accepted and every
    # question failed with OverflowError "Python int too large to convert to SQLite INTEGER"; ef_construction 2**64
    # failed indexing with hnswlib's TypeError
    ({"router": False, "baseline_k": 2**63}, f"baseline_k={2**63}: allowed values are an integer >= 1 and <= 2147483647"),
    ({"hnsw_ef_construction": 2**64}, "hnsw_ef_construction=18446744073709551616: allowed values are an integer >= 1 and"),
    # an int past a float's range (a settings JSON may hold one) raised OverflowError, not a ConfigError
    ({"temperature": 10**400}, f"temperature={10**400}: allowed values are a number >= 0.0"),
    ({"gate_delta": -(10**400)}, f"gate_delta={-(10**400)}: allowed values are a number > 0.0 and < 1.0"),
])
def test_bad_value_raises_at_construction_naming_field_and_allowed_values(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        Config(**changes)
    assert message in str(err.value)
    with pytest.raises(ConfigError):  # with_ checks too
        Config().with_(**changes)
    assert isinstance(err.value, EdgeRAGError) and isinstance(err.value, ValueError)


def test_tier_spec_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"TierSpec.k=0: allowed values are integers >= 1"):
        TierSpec(k=0, context_chars=600, max_new_tokens=64, rerank=False)
    with pytest.raises(ConfigError, match=r"TierSpec.k=9223372036854775808: allowed values are integers >= 1 and <= "):
        TierSpec(k=2**63, context_chars=600, max_new_tokens=64, rerank=False)  # the search's LIMIT, as baseline_k
    # TierSpec(rerank="no") was taken as true: that tier reranked
    with pytest.raises(ConfigError, match=r"TierSpec.rerank='no': allowed values are True, False"):
        TierSpec(k=1, context_chars=600, max_new_tokens=64, rerank="no")  # type: ignore[arg-type]


def test_config_is_hashable_and_equal_by_value() -> None:
    assert hash(Config()) == hash(Config()) and Config() == Config()
    assert len({Config(), Config(), Config(gate="none")}) == 2
    hard = Config(tier_override="HARD")  # the tier's value is accepted and stored as the Tier
    assert hard.tier_override is Tier.HARD and hard == Config(tier_override=Tier.HARD)


def test_tiers_accept_a_dict_and_stay_immutable() -> None:
    base = Config()
    short = base.with_(tiers={t: replace(s, max_new_tokens=8) for t, s in base.tiers.items()})
    assert [short.tier(t).max_new_tokens for t in TIERS] == [8, 8, 8]
    assert short.tier(Tier.HARD).k == base.tier(Tier.HARD).k and hash(short) != hash(base)
    assert dict(short.tiers) == {t: short.tier(t) for t in TIERS}
    with pytest.raises(TypeError):
        short.tiers[Tier.HARD] = base.tier(Tier.HARD)  # type: ignore[index]


def test_tier_order_is_cost_order() -> None:
    assert TIERS == (Tier.EASY, Tier.MEDIUM, Tier.HARD) == tuple(Tier)
    budgets = [Config().tier(t) for t in TIERS]
    assert [b.k for b in budgets] == sorted(b.k for b in budgets)
    assert [b.context_chars for b in budgets] == sorted(b.context_chars for b in budgets)


def test_config_accepts_exactly_the_gates_that_exist() -> None:
    for name in gate.GATES:
        assert gate.evidence_gate([0.9, 0.8], Config(gate=name)).method
    assert GATES == gate.GATES


def test_threads_zero_takes_omp_num_threads_else_the_cores_this_process_may_use(monkeypatch) -> None:
    """`make test` runs two files at a time on two cores with OMP_NUM_THREADS=1 each (tests/isolated.py): the
    sessions onnxruntime and llama.cpp open for ``threads = 0`` take it; without it, the process's CPUs."""
    import os

    from edge_rag.config import default_threads
    from edge_rag.retrieval.encode import session_options

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads() == 3 and session_options(0).intra_op_num_threads == 3
    assert session_options(2).intra_op_num_threads == 2  # an explicit count wins
    for unusable in ("", "0", "4,2", "x"):
        monkeypatch.setenv("OMP_NUM_THREADS", unusable)
        assert default_threads() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_threads() == len(os.sched_getaffinity(0)) >= 1


@pytest.mark.parametrize("argv, message", [
    (["remove", "x", "--db", "db", "--wait", "nan"], "seconds must be a finite number"),  # it waited forever
    (["remove", "x", "--db", "db", "--wait", "-1"], "seconds must be a finite number"),
    (["ask", "hi", "--db", "db", "--threads", "99999999999999999999"], "<= 1024"),  # blamed on the model file
    (["ask", "hi", "--db", "db", "--threads", "1.5"], "not a whole number"),
    (["ask", "hi", "--db", "db", "--temperature", "nan"], "temperature=nan"),  # refused only as the store opened
    (["doctor", "--db", "db", "--sample", "-5"], "must be positive"),  # a traceback
    (["doctor", "--db", "db", "--sample", "0"], "must be positive"),  # "recall 1.000 over 0 vectors: ok"
    (["models", "verify", "--threads", "99999999999"], "<= 1024"),  # onnxruntime's TypeError, a traceback
    (["models", "install", "x.tar", "--threads", "-3"], ">= 0"),
    (["demo", "-n", "-1", "--db", "db", "--bundle", "/nonexistent"], "must be positive"),  # all but the last question
])
def test_cli_values_out_of_range_are_usage_errors(argv: list[str], message: str, capsys) -> None:
    """Each is refused by the parser (exit 2, the option named) before anything is opened."""
    from edge_rag.cli.commands import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("option, value, message", [
    ("--timeout", "nan", "question_timeout_s must be positive and finite"),  # no question ever timed out
    ("--timeout", "inf", "question_timeout_s must be positive and finite"),
    ("--timeout", "0", "question_timeout_s must be positive and finite"),
    ("--idle-reset", "-1", "idle_reset_s must be positive and finite"),
    ("--max-queue", "-1", "max_queue must be >= 0"),  # it said "max_queue and suggestions", no option of the CLI
    ("--port", "99999", "port must be 0..65535"),
    ("--port", "http", "not a whole number: 'http'"),
])
def test_serve_settings_out_of_range_are_usage_errors_naming_the_option(option: str, value: str, message: str,
                                                                        capsys) -> None:
    """`edge-rag serve --timeout 0` said 'edge-rag: error: question_timeout_s must be positive', a name the user never
    typed, with no usage line (`ask --temperature -1` names its option). Each is refused by the parser as ask's are:
    exit 2, the option and ServeConfig's rule named, before any model loads or port is taken."""
    from edge_rag.cli.commands import main

    with pytest.raises(SystemExit) as exc:
        main(["serve", "--db", "db", "--bundle", "/nonexistent", option, value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {option}: {message}" in err and err.startswith("usage:"), err


def test_the_help_names_the_config_defaults_the_flags_leave_in_place(capsys) -> None:
    """--memory-mb and --temperature left Config's default in force unsaid (docs/reference/cli.md: no default), so a
    Pi's user could not tell the budget was 2048 MB."""
    from edge_rag.cli.commands import main

    with pytest.raises(SystemExit):
        main(["ask", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert f"(default {Config().memory_budget_mb})" in shown and f"(default {Config().temperature:g};" in shown
    with pytest.raises(SystemExit):  # it said "~/.cache/edge-rag/bundles/PROFILE or $EDGE_RAG_HOME": not that folder
        main(["models", "pull", "--help"])
    assert "bundles/PROFILE in $EDGE_RAG_HOME" in " ".join(capsys.readouterr().out.split())


def test_every_error_edge_rag_raises_on_purpose_is_exported() -> None:
    """docs/reference/config.md: a bad value raises ConfigError; `from edge_rag import ConfigError` was an ImportError
    (DiskFullError too), so a caller could not catch it by the name the docs give."""
    import edge_rag
    from edge_rag import errors

    ours = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.EdgeRAGError)}
    assert ours <= set(edge_rag.__all__) and all(getattr(edge_rag, n) is getattr(errors, n) for n in ours)


def test_a_type_checker_sees_the_edgerag_the_package_exports(tmp_path) -> None:
    """The package ships py.typed so mypy and IDEs check code that uses it (docs/reference/api.md), but ``EdgeRAG``,
    imported on first use (the package's ``__getattr__``), was Any to them: ``rag.ask(42)`` and a misspelt method
    passed the check."""
    from mypy import api

    user = tmp_path / "kiosk_app.py"
    user.write_text("from edge_rag import EdgeRAG\n\nrag = EdgeRAG('kiosk-db')\nrag.ask(42)\nrag.answr('Where?')\n")
    out, _, status = api.run([str(user), "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache")])
    assert status == 1 and '"ask" of "EdgeRAG" has incompatible type "int"' in out and '"answr"' in out, out


def test_listening_off_loopback_without_a_token_names_every_way_to_give_one() -> None:
    """docs/guides/kiosk.md gives the token with --token-file; `serve --host 0.0.0.0` without one said only 'pass
    --token or set EDGE_RAG_TOKEN'."""
    from edge_rag.serve.config import ServeConfig

    with pytest.raises(ValueError, match="pass --token, --token-file or set EDGE_RAG_TOKEN"):
        ServeConfig(host="0.0.0.0")


@pytest.mark.parametrize("source", ["--token", "env", "--token-file"])
def test_a_short_token_is_refused_off_loopback_and_warned_of_on_it(source: str, tmp_path, monkeypatch, capsys) -> None:
    """A 2-letter `--token zq` (or $EDGE_RAG_TOKEN, or a token file of 3 characters) was taken without a word: the
    throttle reads a wrong token a minute per address, but each device on the network has its own free tries, and so
    few letters fall within hours. Off loopback it is refused, on loopback warned of once; the token is never said."""
    import argparse

    from edge_rag.serve import add_arguments
    from edge_rag.serve import main as serve
    from edge_rag.serve.config import ServeConfig

    monkeypatch.delenv("EDGE_RAG_TOKEN", raising=False)
    token = {"--token": "zq", "env": "zq9", "--token-file": "k3y"}[source]
    given = {"--token": ["--token", token], "env": [], "--token-file": ["--token-file", str(tmp_path / "t")]}[source]
    if source == "env":
        monkeypatch.setenv("EDGE_RAG_TOKEN", token)
    (tmp_path / "t").write_text(token + "\n")
    (tmp_path / "t").chmod(0o600)
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def opened(args, index_threads: int):  # the models are not what this is about: stop before loading them
        raise EdgeRAGError("not opened")

    for host, said in (("0.0.0.0", "needs an API token of at least 16 characters"), ("127.0.0.1", "not opened")):
        with pytest.raises(EdgeRAGError, match=said):
            serve(parser.parse_args(["--host", host, "--port", "0", *given]), opened)
        out, err = capsys.readouterr()
        assert err.count("warning: the API token is shorter than 16 characters") == (host == "127.0.0.1"), err
        assert token not in out + err
    with pytest.raises(EdgeRAGError, match="not opened"):  # 16 characters: nothing to say, on any interface
        serve(parser.parse_args(["--port", "0", "--token", "x" * 16]), opened)
    assert capsys.readouterr().err == "" and ServeConfig(host="0.0.0.0", token="x" * 16).token
