"""``klwatch compare CONTROL RESUMED``: does a checkpoint→resume run's KL follow a continuous run's?

The seed's reproduction test. Run one config twice, once straight through (CONTROL) and once with a
checkpoint and a resume (RESUMED). With a correct resume the two KL curves are the same up to noise
(exactly the same with the same seed and deterministic kernels); with a reference rebuilt from the
resumed weights, RESUMED's KL collapses at the resume and regrows from zero.

How "the same up to noise" is decided, in log space (KL noise is multiplicative):

- the per-step gap is ``d = log(RESUMED + eps) - log(CONTROL + eps)`` on the steps both logged;
- the tolerance is learned, never fixed: ``sigmas`` times the gap noise two independent runs would
  show, from the control's own step-to-step noise (robust MAD), widened to the spread of the gaps
  before the resume when the two runs already differ there (different seeds or trackers), with a
  small floor (float32 vs float64 storage, rounding);
- they *part* at the first step from the resume on where ``|d|`` exceeds the tolerance for
  ``consecutive`` steps in a row, confirmed by a two-sample test (Mann-Whitney U) of the gaps after
  vs before the resume, so a lone outlier or a run of noise does not fail a reproduction.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal, Optional

import numpy as np
import typer
from scipy import stats

from .cli_common import MetricOpt, err
from .model import LineageResult, Series
from .pipeline import ScanConfig, matches_pattern, scan
from .reference_reset import typical_kl
from .report import round_sig
from .sources import split_pattern
from .stats import diff_noise, floored_log, last_per_step, robust_sigma

EXIT_AGREE, EXIT_PARTED, EXIT_USAGE, EXIT_UNREADABLE = 0, 1, 2, 3
SCHEMA = "klwatch.compare/1"


@dataclass(frozen=True)
class CompareConfig:
    sigmas: float = 4.0
    """Tolerance in units of the gap noise."""
    min_tolerance: float = 0.05
    """Smallest tolerance, in log units (about 5%): storage precision and rounding are not a parting."""
    consecutive: int = 2
    """Points in a row beyond the tolerance that make a parting."""
    window: int = 20
    """Points on each side of the resume compared by the two-sample test."""
    alpha: float = 0.01
    """Significance of the two-sample test that confirms a parting."""
    zero_fraction: float = 0.01
    """The log floor, as a fraction of the control's typical KL (a KL of ~0 stays finite)."""


@dataclass
class Comparison:
    """The verdict of one comparison, with what a person needs to check it."""

    verdict: Literal["agree", "parted", "insufficient"]
    resume_step: int
    n_pre: int
    n_post: int
    tolerance: float
    """In log units: the resumed KL may be within a factor exp(tolerance) of the control."""
    noise: float
    """The control's per-point noise (log units)."""
    pre_spread: float | None
    p_value: float | None
    part_step: int | None = None
    control_at: float | None = None
    resumed_at: float | None = None
    gap: float | None = None
    """RESUMED - CONTROL at the parting step."""
    ratio: float | None = None
    """RESUMED / CONTROL at the parting step."""
    max_gap_step: int | None = None
    max_ratio: float | None = None
    last_step: int | None = None
    explanation: str = ""
    warnings: list[str] = field(default_factory=list)


def _finite_last_per_step(s: Series) -> tuple[np.ndarray, np.ndarray]:
    """Steps ascending, one finite value each: the *last* one logged (a resumed process re-logs a rewound step)."""
    out = last_per_step(s.take(np.isfinite(s.values)))
    return out.steps, out.values


def compare_series(control: Series, resumed: Series, *, resume_step: int, config: CompareConfig = CompareConfig()) -> Comparison:
    """Compare two KL series (already on one step axis) from ``resume_step`` on. Pure: no I/O."""
    cs, cv = _finite_last_per_step(control)
    rs, rv = _finite_last_per_step(resumed)
    common = np.intersect1d(cs, rs)
    c = cv[np.searchsorted(cs, common)]
    r = rv[np.searchsorted(rs, common)]
    scale = typical_kl(cv)
    eps = max(config.zero_fraction * scale, 1e-12)
    d = floored_log(r, eps) - floored_log(c, eps)
    pre, post = common < resume_step, common >= resume_step
    d_pre, d_post = d[pre], d[post]
    post_steps = common[post]

    lc = floored_log(cv, eps)
    noise = diff_noise(lc) if len(lc) >= 3 else 0.0
    pre_win = d_pre[-config.window:]
    pre_spread = robust_sigma(pre_win) if len(pre_win) >= 5 else None
    tol = max(config.min_tolerance, config.sigmas * math.sqrt(2.0) * noise,
              config.sigmas * pre_spread if pre_spread is not None else 0.0)
    out = Comparison("insufficient", int(resume_step), int(pre.sum()), int(post.sum()), tol, noise, pre_spread, None,
                     last_step=int(post_steps[-1]) if len(post_steps) else None)
    if len(pre_win) >= 5 and abs(float(np.median(pre_win))) > tol:
        out.warnings.append(f"the runs already differ before the resume (median KL ratio {math.exp(float(np.median(pre_win))):.3g}): "
                            "are they the same config and seed?")
    if len(d_post) < config.consecutive:
        out.explanation = (f"Only {len(d_post)} step(s) logged by both runs from step {resume_step} on: "
                           f"need at least {config.consecutive} to compare.")
        return out

    over = np.abs(d_post) > tol
    k = config.consecutive
    run = np.convolve(over.astype(int), np.ones(k, dtype=int), mode="valid") == k
    first = int(np.argmax(run)) if run.any() else None

    start = first if first is not None else 0
    x = d_post[start:start + config.window]
    if len(pre_win) >= 3 and len(x) >= 3:
        both = np.concatenate([x, pre_win])
        out.p_value = 1.0 if np.ptp(both) == 0 else float(stats.mannwhitneyu(x, pre_win, alternative="two-sided").pvalue)

    i_max = int(np.argmax(np.abs(d_post)))
    out.max_gap_step = int(post_steps[i_max])
    c_post, r_post = c[post], r[post]
    out.max_ratio = _ratio(r_post[i_max], c_post[i_max])
    tol_f = math.exp(tol)
    p_txt = f"p={out.p_value:.2g}" if out.p_value is not None else "no two-sample test (too few steps before the resume)"
    if first is not None:
        out.part_step = int(post_steps[first])
        out.control_at, out.resumed_at = float(c_post[first]), float(r_post[first])
        out.gap = out.resumed_at - out.control_at
        out.ratio = _ratio(out.resumed_at, out.control_at)
    if first is not None and (out.p_value is None or out.p_value < config.alpha):
        out.verdict = "parted"
        out.explanation = (f"RESUMED's KL parts from CONTROL's at step {out.part_step}: {out.resumed_at:.3g} vs "
                           f"{out.control_at:.3g} (x{_fmt_ratio(out.ratio)}, gap {out.gap:+.3g}), beyond the tolerance of "
                           f"x{tol_f:.3g} learned from the control's noise, for {k}+ steps in a row ({p_txt}).")
        if out.resumed_at < out.control_at / tol_f:
            out.explanation += " The KL fell at the resume: the reference was likely rebuilt from the resumed weights."
        return out
    out.verdict = "agree"
    out.explanation = (f"RESUMED's KL follows CONTROL's over {len(d_post)} step(s) from step {resume_step}: largest "
                       f"ratio x{_fmt_ratio(out.max_ratio)} at step {out.max_gap_step}, tolerance x{tol_f:.3g} ({p_txt}).")
    if first is not None:
        out.explanation += (f" (Beyond the tolerance from step {out.part_step}, but not distributed differently from the "
                            "gaps before the resume.)")
    return out


def _ratio(a: float, b: float) -> float | None:
    if b == 0:
        return None if a != 0 else 1.0
    return float(a / b)


def _fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


# ------------------------------------------------------------------------------------- command


class CompareUsageError(Exception):
    """Exit 2: the SOURCE does not resolve to one training run, or there is nothing to compare."""


class CompareReadError(Exception):
    """Exit 3: a SOURCE could not be read."""


def resolve_run(spec: str, *, role: str, config: ScanConfig) -> LineageResult:
    """The single training run a SOURCE (possibly with ``#PATTERN``) names, read through the pipeline."""
    base, pattern = split_pattern(spec)
    result = scan([base], config=config)
    errors = [e.message for s in result.sources for e in s.errors]
    if result.nothing_read:
        raise CompareReadError(f"{role} {spec}: nothing could be read" + (f" ({'; '.join(errors)})" if errors else ""))
    matched = [r for r in result.results if matches_pattern(pattern, r.lineage)]
    names = ", ".join(sorted(r.lineage.name for r in result.results if r.status != "error")) or "none"
    unreadable = errors + [f"{r.lineage.name}: {r.error}" for r in result.results if r.status == "error"]
    if not matched and unreadable:
        raise CompareReadError(f"{role} {spec}: no readable training run matches"
                               + (f" #{pattern}" if pattern else "") + f" ({'; '.join(unreadable)})")
    if not matched:
        raise CompareUsageError(f"{role} {spec}: no training run matches #{pattern} (runs there: {names})")
    if len(matched) > 1:
        shown = ", ".join(sorted(r.lineage.name for r in matched))
        raise CompareUsageError(f"{role} {spec} holds {len(matched)} training runs ({shown}); name one with "
                                f"{base}#PATTERN (a glob on the run's name or id)")
    r = matched[0]
    if r.status == "error":
        raise CompareReadError(f"{role} {spec}: run {r.lineage.name} could not be read: {r.error}")
    if r.metric is None:
        raise CompareUsageError(f"{role} {spec}: run {r.lineage.name} logs no reference-KL metric; name it with --metric")
    return r


def kl_series(r: LineageResult) -> Series:
    """A training run's KL over all its pieces, signed as a distance (``Lineage.kl_pieces``)."""
    return Series.concat([s for s in r.lineage.kl_pieces() if s is not None])


def _side(spec: str, r: LineageResult) -> dict[str, Any]:
    return {"spec": spec, "id": r.lineage.id, "name": r.lineage.name,
            "trackers": list(dict.fromkeys(s.kind for s in r.lineage.segments)), "metric": r.metric,
            "boundaries": [int(b.step) for b in r.lineage.boundaries]}


def comparison_dict(cmp: Comparison, *, control: dict[str, Any], resumed: dict[str, Any], resume_from: str) -> dict[str, Any]:
    d = asdict(cmp)
    for k, v in list(d.items()):
        if isinstance(v, float):
            d[k] = round_sig(v)
    d["tolerance_ratio"] = round_sig(math.exp(cmp.tolerance))
    return {"schema": SCHEMA, "control": control, "resumed": resumed, "resume_step_from": resume_from,
            "test": "mann-whitney-u", **d}


def compare_command(
    control: Annotated[str, typer.Argument(help="The continuous run: a SOURCE, with #PATTERN when it holds several runs.", show_default=False)],
    resumed: Annotated[str, typer.Argument(help="The checkpoint→resume run of the same config: a SOURCE[#PATTERN].", show_default=False)],
    metric: MetricOpt = None,
    from_step: Annotated[Optional[int], typer.Option("--from-step", help="Compare from this step (default: RESUMED's first resume).")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
    sigmas: Annotated[float, typer.Option("--sigmas", min=0.5, help="Tolerance, in units of the noise learned from the control.")] = CompareConfig.sigmas,
    window: Annotated[int, typer.Option("--window", min=3, help="Points each side of the resume for the two-sample test.")] = CompareConfig.window,
) -> None:
    """Fail when a resumed run's KL parts from a continuous run's after the resume (the seed's reproduction test).

    Exit codes: 0 the curves agree; 1 they part; 2 bad usage (a SOURCE is not exactly one training
    run, no resume step, nothing in common); 3 a SOURCE could not be read.
    """
    if fmt not in ("table", "json"):
        err.print(f"[red]error[/] --format must be table or json, not {fmt!r}")
        raise typer.Exit(EXIT_USAGE)
    scan_config = ScanConfig(metrics=tuple(metric or ()), findings=False)
    try:
        c_run = resolve_run(control, role="CONTROL", config=scan_config)
        r_run = resolve_run(resumed, role="RESUMED", config=scan_config)
    except CompareUsageError as exc:
        err.print(f"[red]error[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    except CompareReadError as exc:
        err.print(f"[red]error[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_UNREADABLE)
    if from_step is not None:
        resume_step, resume_from = from_step, "--from-step"
    elif r_run.lineage.boundaries:
        resume_step, resume_from = int(r_run.lineage.boundaries[0].step), "first boundary of RESUMED"
    else:
        err.print(f"[red]error[/] RESUMED {resumed}: no resume found in run {r_run.lineage.name}; give --from-step STEP",
                  highlight=False)
        raise typer.Exit(EXIT_USAGE)
    cmp = compare_series(kl_series(c_run), kl_series(r_run), resume_step=resume_step,
                         config=CompareConfig(sigmas=sigmas, window=window))
    if c_run.lineage.boundaries:
        cmp.warnings.append(f"CONTROL {c_run.lineage.name} has resumes of its own (steps "
                            f"{', '.join(str(b.step) for b in c_run.lineage.boundaries)}): it is not a continuous run")
    if c_run.metric != r_run.metric:
        cmp.warnings.append(f"the runs log KL under different names: {c_run.metric} (CONTROL) vs {r_run.metric} (RESUMED)")
    if cmp.verdict == "insufficient":
        err.print(f"[red]error[/] {cmp.explanation}", highlight=False)
        raise typer.Exit(EXIT_USAGE)
    if fmt == "json":
        print(json.dumps(comparison_dict(cmp, control=_side(control, c_run), resumed=_side(resumed, r_run),
                                         resume_from=resume_from), indent=2))
    else:
        _render_table(cmp, c_run, r_run, resume_from)
    raise typer.Exit(EXIT_PARTED if cmp.verdict == "parted" else EXIT_AGREE)


def _render_table(cmp: Comparison, c_run: LineageResult, r_run: LineageResult, resume_from: str) -> None:
    from rich.console import Console
    from rich.table import Table

    g = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
    t = Table(title="klwatch compare", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    kinds = lambda r: ",".join(dict.fromkeys(s.kind for s in r.lineage.segments))  # noqa: E731
    t.add_row("control", f"{c_run.lineage.name} ({kinds(c_run)}, {c_run.metric})")
    t.add_row("resumed", f"{r_run.lineage.name} ({kinds(r_run)}, {r_run.metric})")
    t.add_row("from step", f"{cmp.resume_step} ({resume_from})")
    t.add_row("steps compared", f"{cmp.n_pre} before, {cmp.n_post} from the resume on")
    t.add_row("tolerance", f"x{math.exp(cmp.tolerance):.3g} (control noise {cmp.noise:.3g} in log)")
    t.add_row("two-sample test", "-" if cmp.p_value is None else f"Mann-Whitney p={cmp.p_value:.3g}")
    style = "bold red" if cmp.verdict == "parted" else "green"
    t.add_row("verdict", f"[{style}]{cmp.verdict}[/]")
    if cmp.part_step is not None:
        t.add_row("parts at step", f"{cmp.part_step}: resumed {g(cmp.resumed_at)} vs control {g(cmp.control_at)} "
                                   f"(x{_fmt_ratio(cmp.ratio)}, gap {cmp.gap:+.3g})")
    t.add_row("largest gap", f"x{_fmt_ratio(cmp.max_ratio)} at step {cmp.max_gap_step}")
    console = Console()
    console.print(t)
    console.print(cmp.explanation, highlight=False)
    for w in cmp.warnings:
        err.print(f"[yellow]warning[/] {w}", highlight=False)
