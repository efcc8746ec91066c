"""SPEC.md's JSON report shape, checked field by field (the contract CI scripts rely on)."""

from __future__ import annotations

from typing import Any

KINDS = {"wandb-offline", "wandb-api", "mlflow", "tensorboard", "table", "checkpoints"}
STATUSES = {"reference_reset", "ok", "intentional", "inconclusive", "no_kl_metric", "kl_disabled", "insufficient_data", "error"}
EVIDENCE = {"new_tracker_run", "new_event_file", "step_rewind", "duplicate_steps", "time_gap", "runtime_reset",
            "checkpoint", "declared",
            "model_from_checkpoint", "starts_past_first_step"}  # added (README, "Additions to the contract")
VERDICTS = {"reference_reset", "ok", "intentional", "inconclusive"}


def _opt(value: Any, typ: type | tuple[type, ...]) -> bool:
    return value is None or isinstance(value, typ)


def check_report(report: dict) -> None:
    """Raise AssertionError naming the first field that breaks SPEC.md's report shape."""
    assert report["schema"] == "klwatch.report/1"
    assert isinstance(report["tool_version"], str)
    assert isinstance(report["generated_at"], str) and report["generated_at"].endswith("Z")
    for s in report["sources"]:
        assert isinstance(s["spec"], str)
        assert all(k in KINDS for k in s["kinds"]), s
        assert _opt(s["error"], str)
    for lin in report["lineages"]:
        assert isinstance(lin["id"], str) and lin["id"]
        assert isinstance(lin["name"], str)
        assert lin["status"] in STATUSES, lin["status"]
        assert _opt(lin["metric"], str)
        assert _opt(lin["error"], str)
        # additions: why the pieces are one run (README "Additions to the contract")
        assert all(isinstance(n, str) and n for n in lin.get("stitching", []))
        for m in lin["members"]:
            assert m["kind"] in KINDS and isinstance(m["ref"], str)
            assert _opt(m["first_step"], int) and _opt(m["last_step"], int)
        for b in lin["boundaries"]:
            assert isinstance(b["step"], int)
            assert _opt(b["resumed_from_step"], int)
            assert b["evidence"] and all(e in EVIDENCE for e in b["evidence"]), b
            assert b["verdict"] in VERDICTS
            assert isinstance(b["score"], float | int) and 0.0 <= b["score"] <= 1.0
            assert _opt(b["kl_before"], float | int) and _opt(b["kl_after"], float | int)
            assert isinstance(b["explanation"], str) and b["explanation"]
        for f in lin["findings"]:
            assert isinstance(f["detector"], str) and f["severity"] in {"error", "warning", "info"}
            assert _opt(f["step"], int) and isinstance(f["message"], str)
        if any(b["verdict"] == "reference_reset" for b in lin["boundaries"]):
            assert lin["status"] == "reference_reset"
