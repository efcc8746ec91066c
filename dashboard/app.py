"""klwatch dashboard: every training run, every resume boundary, the KL drop you cannot miss.

    streamlit run dashboard/app.py -- [--allow-add ROOT_OR_HOST]... [SOURCE...]
    (or: klwatch dashboard [--allow-add ROOT_OR_HOST]... [SOURCE...])

A thin face over ``klwatch.pipeline`` (through the cached layers of ``klwatch.dashboard.data``): nothing
here decides a verdict, a finding or a comparison. The selected run, its panels and chart options, the
control run it is compared with, the filters, the sources in view, the metric choice, the stitching
key and any changed threshold live in the URL's query parameters, so a link opens the same view and
the browser's Back and Forward step through the views. A link only
chooses among what the operator started the dashboard with (``klwatch.dashboard.safety``); every
run name, spec and message from a source is shown scrubbed of secrets and escaped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd
import streamlit as st

# `python -m streamlit` puts the working directory first on the import path: started from the folder that holds
# a clone named klwatch/, that folder would shadow the installed package (a namespace package, with no
# __version__). The app imports nothing from the working directory.
if "klwatch" not in sys.modules and os.path.isdir("klwatch"):
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != os.getcwd()]

try:
    from klwatch.dashboard import charts, data, safety
except ModuleNotFoundError as exc:  # `streamlit run dashboard/app.py` in a checkout nobody installed
    if exc.name != "klwatch":
        raise
    sys.exit("klwatch is not installed in this Python: run `bash scripts/setup.sh` (or `pip install -e .`) first.")
from klwatch.comparison import Comparison, first_resume
from klwatch.model import BoundaryVerdict, Finding, Lineage, LineageResult
from klwatch.pipeline import ScanConfig
from klwatch.stitching import StitchConfig, load_lineage_file
from klwatch.redact import redact_spec, scrub
from klwatch.reference_reset import ReferenceResetConfig
from klwatch.report import boundary_dict, clean_strings

STATUS_ICON = {"reference_reset": ":red[:material/error:]", "ok": ":green[:material/check_circle:]",
               data.OK_WITH_FINDINGS: ":violet[:material/report:]",
               "intentional": ":blue[:material/info:]", "error": ":red[:material/block:]",
               "no_kl_metric": ":gray[:material/help:]", "kl_disabled": ":gray[:material/do_not_disturb_on:]",
               "insufficient_data": ":orange[:material/hourglass_empty:]", "inconclusive": ":orange[:material/help:]"}
VERDICT_ICON = {"reference_reset": ":material/error:", "ok": ":material/check_circle:", "intentional": ":material/info:",
                "inconclusive": ":material/help:"}
BADGE_COLOR = {"reference_reset": "red", "ok": "green", data.OK_WITH_FINDINGS: "violet", "intentional": "blue", "error": "red",
               "insufficient_data": "orange", "no_kl_metric": "gray", "kl_disabled": "gray", "inconclusive": "orange"}
ALL_STATUSES = ["reference_reset", "inconclusive", data.OK_WITH_FINDINGS, "ok", "intentional", "error", "insufficient_data",
                "no_kl_metric", "kl_disabled"]
SEVERITY_BADGE = {"error": "red", "warning": "orange", "info": "gray"}
# (comments, not docstrings: Streamlit's magic would write a bare string on the page)
ZOOM_STEPS = 200  # steps either side of a resume that zoom-to-boundary shows by default
RUN_FRAGMENT = "open_run"  # the fragment a click on a run reruns (``show_open_run``)

# The detector thresholds on the sidebar: (field, label, min, max, step, shown without expanding).
THRESHOLDS: list[tuple[str, str, float, float, float, bool]] = [
    ("reset_score", "Reset when score ≥", 0.5, 1.0, 0.01, True),
    ("ok_score", "OK when score ≤", 0.0, 0.5, 0.01, True),
    ("low_fraction", "'Low' below this fraction of the KL before", 0.05, 0.95, 0.05, True),
    ("min_low_points", "Low points needed after the resume", 1, 10, 1, True),
    ("grown_fraction", "KL must have grown to this fraction of typical", 0.0, 0.5, 0.01, False),
    ("window_before", "Points compared before", 5, 100, 1, False),
    ("window_after", "Points compared after", 2, 50, 1, False),
    ("min_points_before", "Fewest points before", 2, 50, 1, False),
    ("min_points_after", "Fewest points after", 1, 20, 1, False),
    ("prior", "Prior probability of a reset", 0.01, 0.99, 0.01, False),
]
_DEFAULTS = ReferenceResetConfig()


# The launch sources that carry credentials, set by ``main`` on every run of the script (a comment, not
# a string: Streamlit's magic would write a bare string on the page).
_secrets: list[str] = []


def current_launch() -> safety.Launch:
    """The SOURCEs after ``--`` of ``streamlit run app.py -- ...``, else $KLWATCH_DASHBOARD_SOURCES, else
    sample_runs/; and the allow-list of what a person may add (``--allow-add``, $KLWATCH_DASHBOARD_ALLOW_ADD)."""
    return safety.launch_settings(sys.argv, os.environ, app_file=__file__, default=data.default_sources())


def say(text: object) -> str:
    """Text from a source, a link or an error, as page markdown: secrets scrubbed, then escaped."""
    return safety.md(scrub(str(text), _secrets))


def label(spec: str, launch: safety.Launch) -> str:
    """A source as the page names it: the launch label (credentials redacted), or the added spec."""
    return launch.labels.get(spec) or spec


def _parse_threshold(field: str, raw: str) -> float | int | None:
    spec = next(t for t in THRESHOLDS if t[0] == field)
    try:
        value = int(raw) if isinstance(getattr(_DEFAULTS, field), int) else float(raw)
    except ValueError:
        return None
    default = getattr(_DEFAULTS, field)
    return value if min(spec[2], default) <= value <= max(spec[3], default) else None


def _float_param(raw: str | None, lo: float, hi: float, default: float) -> float:
    try:
        value = float(raw) if raw is not None else default
    except ValueError:
        return default
    return value if lo <= value <= hi else default


def apply_view_params() -> None:
    """The run view's part of the URL (run, panels, chart options, zoom, control run) into the
    session: at the first load, and again when Back or Forward brings an earlier URL."""
    ss, qp = st.session_state, st.query_params
    ss["run"] = qp.get("run") or None
    if qp.get("run"):
        ss["_linked_run"] = qp.get("run")
        if qp.get_all("panel"):
            ss[f"linked::{qp.get('run')}"] = [m for m in qp.get_all("panel") if m.strip()]
            ss[f"_panels_changed::{qp.get('run')}"] = True
    ss["smoothing"] = _float_param(qp.get("smooth"), 0.0, 0.99, 0.0)
    ss["log_y"] = qp.get("logy") == "1"
    ss["x_axis"] = qp.get("x") if qp.get("x") in charts.X_AXES else "step"
    ss["zoom"] = qp.get("zoom") or None
    ss["zoom_steps"] = int(_float_param(qp.get("zw"), 1, 10**9, ZOOM_STEPS))
    ss["control"] = qp.get("control") or None
    ss["search"] = qp.get("q") or ""
    ss["finding_filter"] = [f for f in qp.get_all("finding") if f.strip()]


def navigated() -> bool:
    """Whether this run's URL is not the one the page last wrote: Back or Forward brought it."""
    last = st.session_state.get("_written_url")
    return last is not None and last != _current_url()


def _current_url() -> dict[str, list[str]]:
    qp = st.query_params
    return {k: qp.get_all(k) for k in sorted(qp.keys())}


def init_state(launch: safety.Launch) -> None:
    """Once per browser session: start from the link's query parameters (its sources only chosen among
    the launch sources and what the allow-list admits; anything else noted and ignored); later, only
    the view's parameters again when the browser navigated (Back/Forward)."""
    ss = st.session_state
    if ss.get("_initialised"):
        if navigated():
            apply_view_params()
        return
    qp = st.query_params
    ss["_initialised"] = True
    apply_view_params()
    ss["group_by"] = qp.get("group_by") or ""
    chosen = safety.select_sources(qp.get_all("src"), launch)
    ss["shown_sources"] = ([] if len(chosen.shown) == len(launch.sources)
                           else [launch.labels[s] for s in chosen.shown])
    ss["added_sources"] = chosen.added
    ss["_ignored_sources"] = chosen.ignored
    ss["metrics"] = [m for m in qp.get_all("metric") if m.strip()]
    ss["only_flagged"] = qp.get("flagged") == "1"
    ss["only_incomplete"] = qp.get("incomplete") == "1"
    ss["statuses"] = [s for s in qp.get_all("status") if s in ALL_STATUSES]
    for field, *_ in THRESHOLDS:
        ss[f"rr_{field}"] = getattr(_DEFAULTS, field)
        if field in qp:
            value = _parse_threshold(field, qp[field])
            if value is not None:
                ss[f"rr_{field}"] = value


def sources_in_view(launch: safety.Launch) -> list[str]:
    """The launch sources picked in the sidebar (every one when none is), then the added ones."""
    picked = set(st.session_state.get("shown_sources") or [])
    shown = [s for s in launch.sources if launch.labels[s] in picked] or list(launch.sources)
    return list(dict.fromkeys([*shown, *st.session_state["added_sources"]]))


def sync_url(*, run: str | None, launch: safety.Launch) -> None:
    """Write the shareable state to the URL (only what differs from the defaults; sources by label).
    Streamlit pushes a history entry for each change, so Back and Forward step through the views."""
    ss = st.session_state
    shown = [s for s in sources_in_view(launch) if s in launch.sources]
    panels = ss.get(f"linked::{run}") if run else None
    want: dict[str, str | list[str] | None] = {
        "run": run,
        "panel": list(panels) if panels is not None and ss.get("_panels_changed::" + str(run)) else None,
        "smooth": f"{ss['smoothing']:g}" if ss.get("smoothing") else None,
        "logy": "1" if ss.get("log_y") else None,
        "x": ss.get("x_axis") if ss.get("x_axis") not in (None, "step") else None,
        "zoom": ss.get("zoom") or None,
        "zw": str(ss["zoom_steps"]) if ss.get("zoom") and ss.get("zoom_steps") != ZOOM_STEPS else None,
        "control": ss.get("control") or None,
        "q": ss.get("search") or None,
        "finding": list(ss.get("finding_filter") or []),
        "group_by": ss.get("group_by") or None,
        "flagged": "1" if ss.get("only_flagged") else None,
        "incomplete": "1" if ss.get("only_incomplete") else None,
        "status": list(ss.get("statuses") or []),
        "src": safety.link_sources(shown, list(ss.get("added_sources") or []), launch),
        "metric": list(ss.get("metrics") or []),
    }
    for field, *_ in THRESHOLDS:
        value = ss.get(f"rr_{field}")
        want[field] = None if value == getattr(_DEFAULTS, field) else str(value)
    qp = st.query_params
    for key, value in want.items():
        if value in (None, "", []):
            if key in qp:
                del qp[key]
        elif isinstance(value, list):
            if qp.get_all(key) != value:
                qp[key] = value
        elif qp.get(key) != value:
            qp[key] = value
    ss["_written_url"] = _current_url()


def _add_source(allow: safety.AllowList) -> None:
    """Add the typed source when the allow-list admits it (resolved), else say why not."""
    typed = st.session_state.get("new_source", "").strip()
    st.session_state["new_source"] = ""
    if not typed:
        return
    spec, why = allow.admit(typed)
    if spec is None:
        st.session_state["_add_refused"] = (typed, why)
    elif spec not in st.session_state["added_sources"]:
        st.session_state["added_sources"] = [*st.session_state["added_sources"], spec]


def _remove_source(spec: str) -> None:
    st.session_state["added_sources"] = [s for s in st.session_state["added_sources"] if s != spec]


def _reset_thresholds() -> None:
    for field, *_ in THRESHOLDS:
        st.session_state[f"rr_{field}"] = getattr(_DEFAULTS, field)


def _pick_from_table() -> None:
    """A click anywhere on a row (a cell of it, or its selection box) opens that run."""
    selection = st.session_state["fleet_table"].selection
    rows = list(selection.rows) or [cell[0] for cell in getattr(selection, "cells", None) or []]
    keys = st.session_state.get("_table_keys", [])
    if rows and rows[0] < len(keys):
        _open(keys[rows[0]])
        st.rerun(RUN_FRAGMENT)  # the run view only: the fleet is as it was


def _open(key: str) -> None:
    """Open a run: its zoom and comparison are the previous run's no more."""
    ss = st.session_state
    if ss.get("run") != key:
        ss["run"] = key
        ss["zoom"] = None
        if ss.get("control") == key:
            ss["control"] = None


def _pick_from_picture() -> None:
    """A click on a boundary's point opens its run."""
    points = st.session_state["fleet_picture"].selection.points
    if points and points[0].get("customdata"):
        _open(points[0]["customdata"][0])


def sidebar_sources(launch: safety.Launch) -> st.delta_generator.DeltaGenerator:
    """The choice among the launch sources, the source list (filled in once the sources are read),
    the box to add one (only with an allow-list), and Reload."""
    sb = st.sidebar
    sb.header("Sources")
    if len(launch.sources) > 1:
        sb.multiselect("Sources in view", [launch.labels[s] for s in launch.sources], key="shown_sources",
                       placeholder="every source", help="The sources this dashboard was started with.")
    box = sb.container()
    allow = launch.allow
    if allow.enabled:
        sb.text_input("Add a source", key="new_source", on_change=_add_source, args=(allow,),
                      placeholder="a path or tracker under the allowed ones",
                      help="A local file or folder (TensorBoard, W&B run folders, MLflow stores, tables, checkpoints), "
                           "wandb://ENTITY/PROJECT[/RUN] or mlflow://HOST:PORT[/EXPERIMENT] under: "
                           f"{safety.md(allow.describe())}. End with #PATTERN to keep matching runs. Press Enter to add.")
        refused = st.session_state.pop("_add_refused", None)
        if refused:
            sb.error(f"Not added: {safety.code(safety.shorten(redact_spec(refused[0])))}: {safety.md(refused[1])}.")
    else:
        sb.caption("The sources are the ones this dashboard was started with (`klwatch dashboard SOURCE...`); "
                   "a link can choose among them, not add one.")
    c1, c2 = sb.columns(2)
    if allow.enabled:
        c1.button("Add", on_click=_add_source, args=(allow,), width="stretch")
    c2.button("Reload", on_click=data.clear_caches, width="stretch",
              help="Read every source again (local sources are re-read by themselves when their files change; "
                   f"remote ones every {int(data.REMOTE_TTL_SECONDS)} s).")
    for problem in launch.problems:
        sb.error(f"Allow-list entry refused: {say(problem)}")
    return box


def sidebar_config(specs: list[str], fps: dict[str, str]) -> ScanConfig:
    """Metric choice and detector thresholds -> the one ScanConfig the pipeline takes (``fps``: the
    sources' fingerprints, taken once for the page)."""
    sb = st.sidebar
    sb.header("KL metric")
    names: set[str] = set()
    for spec in specs:
        names.update(data.metric_names_cached(spec, fps[spec]))
    current = st.session_state.get("metrics") or []
    sb.multiselect("KL metric (name or glob)", sorted(names | set(current)), key="metrics", accept_new_options=True,
                   placeholder="recognised reference-KL names",
                   help="Empty: the reference-KL names of the major frameworks (train/kl_penalty, kl, actor/kl_loss, ...). "
                        "Type a name or a glob to pick another.")
    sb.header("Detector thresholds")
    values: dict[str, float | int] = {}
    more = sb.expander("More thresholds")
    for field, label, lo, hi, step, main in THRESHOLDS:
        where = sb if main else more
        default = getattr(_DEFAULTS, field)
        cast = int if isinstance(default, int) else float
        values[field] = where.slider(label, min_value=cast(min(lo, default)), max_value=cast(max(hi, default)),
                                     step=cast(step), key=f"rr_{field}", help=_help(field))
    sb.button("Default thresholds", on_click=_reset_thresholds)
    if values["ok_score"] >= values["reset_score"]:
        sb.warning("The OK score is at or above the reset score: every high score is judged a reset first.")
    rr = dataclasses.replace(_DEFAULTS, **values)
    return ScanConfig(metrics=tuple(st.session_state.get("metrics") or ()), reference_reset=rr,
                      stitch=sidebar_stitching())


def sidebar_stitching() -> StitchConfig:
    """The stitching overrides the CLI takes (``--group-by KEY``, ``--lineage FILE``), read by the
    core's own ``load_lineage_file``; a file that cannot be read is said and not used."""
    with st.sidebar.expander("Stitching", expanded=bool(st.session_state.get("group_by"))):
        st.text_input("Group tracker runs by this config/tag key", key="group_by", placeholder="automatic",
                      help="As `klwatch scan --group-by KEY`: tracker runs with the same value of KEY are one training run.")
        upload = st.file_uploader("Lineage file (JSON)", type=["json"], key="lineage_file",
                                  help='As `klwatch scan --lineage FILE`: {"run name": ["ref or run-id glob", ...]}.')
    lineage_map = None
    if upload is not None:
        with tempfile.TemporaryDirectory(prefix="klwatch-lineage-") as tmp:
            path = Path(tmp) / "lineage.json"
            path.write_bytes(upload.getvalue())
            try:
                lineage_map = load_lineage_file(str(path))
            except (OSError, ValueError) as exc:
                st.sidebar.error(f"Lineage file not used: {say(str(exc).replace(str(path), upload.name))}")
    return StitchConfig(group_by=(st.session_state.get("group_by") or "").strip() or None, lineage_map=lineage_map)


def _help(field: str) -> str | None:
    doc = {f.name: f for f in dataclasses.fields(ReferenceResetConfig)}
    return f"ReferenceResetConfig.{field} (default {doc[field].default})"


def show_sources(box: st.delta_generator.DeltaGenerator, fleet: data.Fleet, launch: safety.Launch) -> None:
    """Each source in view with what was found in it, or its error, in place (named redacted)."""
    for spec in fleet.specs:
        read = fleet.reads.get(spec)
        row = box.container(border=True)
        added = spec in st.session_state["added_sources"]
        cols = row.columns([5, 1]) if added else [row, None]
        shown = label(spec, launch)
        name = Path(spec).name if not data.is_remote(spec) and Path(spec).name else shown
        if read is None:
            cols[0].markdown(f"**{say(name)}**")
        elif read.errors and not read.segments:
            cols[0].markdown(f"**{say(name)}**", help=say(shown))
            cols[0].error(say("; ".join(e.message for e in read.errors)), icon=":material/warning:")
        else:
            n_runs = sum(1 for s in fleet.source_of if s == spec)
            cols[0].markdown(f"**{say(name)}** · {n_runs} run(s) · {say(', '.join(read.kinds) or 'nothing')}",
                             help=say(shown))
            if read.errors:
                cols[0].warning(f"{len(read.errors)} part(s) unreadable: " + say("; ".join(e.message for e in read.errors[:3])))
        if cols[1] is not None:
            cols[1].button("Remove", icon=":material/close:", key=f"rm::{spec}", on_click=_remove_source, args=(spec,),
                       help=f"Remove {say(label(spec, launch))}", type="tertiary")


def show_notices(launch: safety.Launch) -> None:
    """Main area: the link's sources that were not served (a link cannot name a new path or host)."""
    ignored = st.session_state.get("_ignored_sources") or []
    if ignored:
        shown = ", ".join(safety.code(safety.shorten(redact_spec(v))) for v in ignored[:5])
        more = f" and {len(ignored) - 5} more" if len(ignored) > 5 else ""
        where = (f" or add one under {say(launch.allow.describe())}" if launch.allow.enabled else "")
        st.warning(f"Ignored from the link: {shown}{more}. A link can only choose among the sources this "
                   f"dashboard was started with{where}.", icon=":material/link_off:")


def show_source_errors(fleet: data.Fleet, launch: safety.Launch) -> None:
    """Main area: a source that cannot be read, or whose ``#PATTERN`` names no run, says so where the user is
    looking."""
    for source in fleet.scan.sources:
        if source.unmatched:
            st.warning(say(source.unmatched), icon=":material/search_off:")
    for spec in fleet.specs:
        read = fleet.reads.get(spec)
        if read is None or not read.errors:
            continue
        name = say(label(spec, launch))
        if not read.segments:
            st.error(f"**{name}** could not be read: " + say("; ".join(e.message for e in read.errors)),
                     icon=":material/warning:")
        else:
            with st.expander(f":material/warning: {name}: {len(read.errors)} part(s) could not be read"):
                for e in read.errors:
                    st.markdown(f"- {say(e.message)}")


@st.fragment
def show_fleet_table(fleet: data.Fleet, config: ScanConfig, findings: dict[str, list[Finding]], pending: bool,
                     launch: safety.Launch) -> None:
    """The search and filters, the table (a click on a row opens the run), how many rows it shows, and
    the JSON report. Findings arrive from the background; until then the rows show their KL status, a
    note says the finding detectors are still running, and the page is drawn again once they are in.
    A fragment: a filter reruns this part only, and a click on a row only the open run
    (``RUN_FRAGMENT``). From outside every fragment that click would start a full rerun, turned into
    the run's, and Streamlit (1.67) would drop the JSON report's deferred download on the way."""
    show_filters(findings)
    shown = filtered_table(data.fleet_table_cached(fleet, findings))
    show_table(shown)
    note = " Finding detectors are still running on the fleet: badges appear as they finish." if pending else ""
    st.caption(f"{len(shown)} of {len(fleet.keys)} training run(s) shown. Click a run (or a point above) to open it.{note}")
    if pending:
        _await_findings(fleet, config)
    specs = list(fleet.specs)
    st.download_button("Download JSON report",  # the CLI's report: findings included, computed on click
                       data=lambda: data.report_json(data.load_fleet(specs, config=config, findings=True).scan,
                                                     secrets=_secrets) + "\n",
                       file_name="klwatch-report.json", mime="application/json", icon=":material/download:", on_click="ignore")
    sync_url(run=st.session_state.get("run"), launch=launch)


@st.fragment(key=RUN_FRAGMENT)
def show_open_run(fleet: data.Fleet, config: ScanConfig, findings: dict[str, list[Finding]], launch: safety.Launch) -> None:
    """The run picker, the open run and the URL. A fragment: a click on a row, or any choice in the run
    view, reruns this part only (at 1,000 runs, drawing the whole page again costs a browser seconds
    and the table's styling a fifth of a second)."""
    run_key = show_run_picker(fleet, findings) if fleet.keys else None
    if run_key is not None:
        with st.container(key="run_view"):
            show_run(run_key, data.judged_run(fleet, run_key, config=config), fleet=fleet, config=config)
    sync_url(run=run_key, launch=launch)


def show_counts(df: pd.DataFrame) -> None:
    """One badge per shown status with its count (most severe first), and the incomplete runs'."""
    counts = df["status"].value_counts().to_dict()
    ranked = sorted(counts, key=lambda k: ALL_STATUSES.index(k) if k in ALL_STATUSES else len(ALL_STATUSES))
    n_incomplete = int((df["incomplete"] != "").sum())
    st.markdown(" ".join([f":{BADGE_COLOR.get(k, 'gray')}-badge[{k}: **{counts[k]}**]" for k in ranked] +
                         ([f":orange-badge[:material/warning: incomplete: **{n_incomplete}**]"] if n_incomplete else []))
                or "No training runs found.")


def show_picture(fleet: data.Fleet, config: ScanConfig) -> None:
    """Every judged boundary as a point (KL after/before vs score); a click on one opens its run."""
    figure = data.fleet_picture_cached(fleet, thresholds=config.reference_reset)
    if figure is None:
        st.caption("No resume boundary in these runs: nothing to judge yet.")
        return
    st.plotly_chart(figure, key="fleet_picture", on_select=_pick_from_picture, selection_mode="points",
                    config={"displaylogo": False})


def show_filters(findings: dict[str, list[Finding]]) -> None:
    """Search, only flagged, only incomplete, status and finding filters (their values live in the session)."""
    c0, c1, c4, c2, c3 = st.columns([2, 1, 1, 2, 2])
    c0.text_input("Search runs", key="search", placeholder="search runs by name", label_visibility="collapsed",
                  icon=":material/search:")
    c1.toggle("Only flagged", key="only_flagged", help="Only runs with a boundary judged reference_reset.")
    c4.toggle("Only incomplete", key="only_incomplete",
              help="Only runs judged on part of their logs: a file could not be read, or was read only up to "
                   "damage or a cut-off end.")
    c2.multiselect("Status", ALL_STATUSES, key="statuses", placeholder="every status", label_visibility="collapsed")
    detectors = sorted({d for found in findings.values() for d in dict.fromkeys(f.detector for f in found)}
                       | set(st.session_state.get("finding_filter") or []))
    c3.multiselect("Finding", detectors, key="finding_filter", placeholder="any finding", label_visibility="collapsed",
                   help="Only runs with one of these findings (resume-integrity detectors other than the KL verdict).")


def filtered_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the filters keep, most severe status first and worst score first within one."""
    ss = st.session_state
    if ss.get("only_flagged"):
        df = df[df["status"] == data.FLAGGED]
    if ss.get("only_incomplete"):
        df = df[df["incomplete"] != ""]
    if ss.get("statuses"):
        df = df[df["status"].isin(ss["statuses"])]
    query = (ss.get("search") or "").strip().lower()
    if query:
        df = df[df["run"].str.lower().str.contains(query, regex=False)]
    wanted = set(ss.get("finding_filter") or [])
    if wanted:
        df = df[df["findings"].map(lambda fs: bool(wanted & set(fs or [])))]
    order = {s: i for i, s in enumerate(ALL_STATUSES)}
    df = df.sort_values(["status", "worst score"], key=lambda c: c.map(order) if c.name == "status" else -c.fillna(-1))
    return df.reset_index(drop=True)


TABLE_COLUMNS = ["run", "status", "incomplete", "findings", "trackers", "segments", "resumes", "worst score", "KL before",
                 "KL after", "at step", "last step", "metric", "error"]
TABLE_CONFIG = {
    "incomplete": st.column_config.TextColumn("incomplete", help="Judged on part of its logs: a file could not "
                                              "be read, or was read only up to damage or a cut-off end (the "
                                              "run's header names each file and why)"),
    "findings": st.column_config.ListColumn("findings", help="What the other resume-integrity detectors "
                                            "reported (empty while they run)"),
    "worst score": st.column_config.ProgressColumn("worst score", min_value=0.0, max_value=1.0, format="%.2f"),
    "KL before": st.column_config.NumberColumn("KL before", format="%.3g", help="KL level before the worst-scoring resume"),
    "KL after": st.column_config.NumberColumn("KL after", format="%.3g", help="first KL after the worst-scoring resume"),
    "at step": st.column_config.NumberColumn("at step", help="step of the worst-scoring resume"),
}


def show_table(df: pd.DataFrame) -> None:
    """The fleet table, its status in the status's colour; a click anywhere on a row opens that run."""
    st.session_state["_table_keys"] = list(df["key"])
    theme = _theme()
    styled = df.style.map(lambda s: f"color: {charts.status_color(s, theme)}; font-weight: 600", subset=["status"])
    st.dataframe(styled, key="fleet_table", placeholder="-", on_select=_pick_from_table,
                 selection_mode=["single-row", "single-cell"], hide_index=True,
                 height=min(38 + 35 * max(len(df), 1), 420), column_order=TABLE_COLUMNS, column_config=TABLE_CONFIG)


@st.fragment(run_every=1.0)
def _await_findings(fleet: data.Fleet, config: ScanConfig) -> None:
    """Poll the background finding jobs (this fragment only) and redraw the page once they are done."""
    if not data.fleet_findings(fleet, config=config)[1]:
        st.rerun(scope="app")


def _mark_panels_changed(key: str) -> None:
    st.session_state["_panels_changed::" + key] = True


def show_stitching(lin: Lineage) -> None:
    """Why these tracker pieces are one training run, and why others were not joined to it: the
    report's ``lineages[].stitching``, every sentence escaped (paths, names and config values are the
    user's)."""
    with st.expander(f"Stitching: why these pieces are one run ({len(lin.notes)} note(s))"):
        if not lin.notes:
            st.caption("One tracker piece: nothing was joined or refused.")
        for note in lin.notes:
            st.markdown("- " + say(note))


def show_run(key: str, result: LineageResult, *, fleet: data.Fleet, config: ScanConfig) -> None:
    """One run: its shown status, findings and tracker link in the header, a warning when its
    stitching looks wrong, the chart with its options, the comparison with a control run, the
    boundaries and the rest."""
    lin = result.lineage
    show_run_header(result)
    show_incomplete(result)
    for why in data.implausible(lin):
        st.warning(f"This stitching looks implausible: {why}. Check the Members below; the sidebar's Stitching "
                   "overrides (group-by key, lineage file) can split it.", icon=":material/call_split:")
    linked = pick_panels(key, result)
    control, cmp = show_compare_controls(key, result, fleet=fleet, config=config)
    x_range = chart_controls(result)
    if result.metric or linked:
        show_run_chart(key, result, fleet=fleet, config=config, linked=linked, control=control, cmp=cmp, x_range=x_range)
    if cmp is not None:
        show_comparison(cmp)
    show_boundaries(result.verdicts)
    show_findings(result.findings)
    show_members(lin)
    show_stitching(lin)
    with st.expander("Run config"):
        if lin.config:
            st.json(scrubbed(lin.config), expanded=1)
        else:
            st.caption("No config was logged.")


def show_run_header(result: LineageResult) -> None:
    """The run's name with its shown status, what it was read from, its link in its tracker, and a
    badge per finding."""
    lin = result.lineage
    status = data.shown_status(result)
    st.header(f"{STATUS_ICON.get(status, '')} {say(lin.name)}", anchor=False)
    trackers = ", ".join(dict.fromkeys(s.kind for s in lin.segments))
    link = data.tracker_link(lin)
    partial = " :orange-badge[:material/warning: incomplete]" if data.incomplete_reasons(result) else ""
    st.markdown(f":{BADGE_COLOR.get(status, 'gray')}-badge[{status}]{partial} · metric "
                f"{safety.code(scrub(result.metric or '-', _secrets))} · {say(trackers)} · {len(lin.segments)} segment(s) · "
                f"{len(lin.boundaries)} resume(s)" + (f" · [{link[0]} :material/open_in_new:]({_link_target(link[1])})" if link else ""))
    if result.findings:
        st.markdown(" ".join(f":{SEVERITY_BADGE.get(f.severity, 'gray')}-badge[:material/report: {say(f.detector)}"
                             f"{f' · step {f.step}' if f.step is not None else ''}]" for f in result.findings),
                    help="Findings of the other resume-integrity detectors (marked on the chart at their step).")


def pick_panels(key: str, result: LineageResult) -> list[str]:
    """The series drawn below the KL: a link's, else the person's choice, else what the findings cite
    and one per family (loss, reward, learning rate, grad norm, entropy)."""
    lin = result.lineage
    names = [n for n in lin.metric_names() if not n.startswith("_") and n != result.metric]
    cited = [m for f in result.findings for m in data.finding_metrics(f, lin) if m != result.metric]
    default = list(dict.fromkeys([*cited, *charts.pick_linked_metrics(names, exclude=[result.metric or "", *cited])]))
    pkey = f"linked::{key}"
    if pkey in st.session_state:  # a link's panels: only the run's own series
        st.session_state[pkey] = [m for m in st.session_state[pkey] if m in names]
    return st.multiselect("Panels below the KL (one x axis; the series a finding cites are added)", names,
                          default=None if pkey in st.session_state else default, key=pkey,
                          on_change=_mark_panels_changed, args=(key,))


def show_run_chart(key: str, result: LineageResult, *, fleet: data.Fleet, config: ScanConfig, linked: list[str],
                   control: LineageResult | None, cmp: Comparison | None, x_range: tuple[float, float] | None) -> None:
    """The run's chart as the view options ask (built once per view: ``data.figure_cached``), and its
    HTML download."""
    lin = result.lineage
    view = {"linked": tuple(linked), "smoothing": float(st.session_state.get("smoothing") or 0.0),
            "log_y": bool(st.session_state.get("log_y")), "x_axis": st.session_state.get("x_axis") or "step",
            "x_range": x_range, "theme": _theme(), "control": st.session_state.get("control"),
            "compare_from": cmp.resume_step if cmp is not None else None}
    fig = data.figure_cached(key, fleet.fingerprints.get(fleet.source_of[fleet.keys.index(key)], ""),
                             data.config_key(config), repr(sorted(view.items())), _result=result, _view=view,
                             _control=control, _comparison=cmp)
    st.plotly_chart(fig, key="run_chart", config=charts.plot_config(lin.name))
    c1, c2 = st.columns([1, 3])
    c1.download_button("Download chart (HTML)", data=lambda: charts.figure_html(fig, filename=lin.name),
                       file_name=f"{charts.plot_config(lin.name)['toImageButtonOptions']['filename']}.html",
                       mime="text/html", icon=":material/download:", on_click="ignore")
    c2.caption("PNG: the camera icon in the chart's toolbar. Hover for every panel's value at that step. "
               "◆ marks a finding at its step on the series it cites.")


def show_findings(findings: list[Finding]) -> None:
    """What the other resume-integrity detectors found, each in its severity's colour."""
    st.subheader("Findings")
    if not findings:
        st.caption("No other detector reported anything.")
    for f in findings:
        where = f" (step {f.step})" if f.step is not None else ""
        text = f"**{say(f.detector)}**{where}: {say(f.message)}"
        {"error": st.error, "warning": st.warning}.get(f.severity, st.info)(text)


def show_members(lin: Lineage) -> None:
    """The run's tracker runs, files and checkpoints, and what their readers warned of."""
    with st.expander("Members (tracker runs, files, checkpoints)"):
        st.dataframe(_members(lin), hide_index=True)
        for w in (w for seg in lin.segments for w in seg.warnings):
            st.warning(say(w))


def show_incomplete(result: LineageResult) -> None:
    """Under the run's header: a run with nothing read says its error; a run judged on part of its
    logs says so, naming each file and why (``data.incomplete_reasons``, escaped); a partly unreadable
    run's error is among those reasons."""
    reasons = data.incomplete_reasons(result)
    if reasons:
        with st.container(key="run_incomplete"):
            st.warning("**Incomplete run:** judged on what could be read; the verdict may change once every "
                       "file reads.\n\n" + "\n".join(f"- {say(why)}" for why in reasons), icon=":material/warning:")
    elif result.error:
        st.error(say(result.error), icon=":material/warning:")


def _link_target(url: str) -> str:
    """A tracker URL as a markdown link target: already http(s) and free of spaces and brackets
    (``data.tracker_link``); parentheses percent-encoded so the target cannot end early."""
    return url.replace("(", "%28").replace(")", "%29")


def _theme() -> str:
    """The browser's theme ('light' or 'dark') for the chart's colours; light when unknown."""
    try:
        kind = st.context.theme.type
    except AttributeError:
        return "light"
    return kind if kind in charts.THEMES else "light"


def chart_controls(result: LineageResult) -> tuple[float, float] | None:
    """Smoothing, log-scale y, the x axis, and zoom to a resume (±N steps): the x range to show."""
    c1, c2, c3, c4, c5 = st.columns([2, 1, 2, 2, 1])
    c1.slider("Smoothing", 0.0, 0.99, step=0.01, key="smoothing",
              help="TensorBoard's exponential moving average, per piece (the raw series stays, faint).")
    c2.toggle("Log y", key="log_y")
    c3.segmented_control("x axis", list(charts.X_AXES), key="x_axis", format_func=lambda x: {
        "step": "Step", "relative": "Relative", "wall": "Wall"}[x], help="Step, hours since the run's first point, or wall time.")
    steps = [str(v.boundary.step) for v in sorted(result.verdicts, key=lambda v: v.boundary.step)]
    if st.session_state.get("zoom") not in steps:
        st.session_state["zoom"] = None
    c4.selectbox("Zoom to resume", steps, key="zoom", index=None, placeholder="whole run",
                 format_func=lambda s: f"resume at step {s}")
    c5.number_input("± steps", min_value=1, step=10, key="zoom_steps")
    zoom = st.session_state.get("zoom")
    if not zoom:
        return None
    verdict = next(v for v in result.verdicts if str(v.boundary.step) == zoom)
    half = int(st.session_state.get("zoom_steps") or ZOOM_STEPS)
    xs = charts.XAxis(st.session_state.get("x_axis") or "step", result.lineage.pieces)
    lo = xs.at(verdict.boundary.step - half, verdict.boundary.piece_index - 1)
    hi = xs.at(verdict.boundary.step + half, verdict.boundary.piece_index)
    center = xs.at(verdict.boundary.step, verdict.boundary.piece_index)
    if center is None:
        return None
    if xs.kind == "step" or lo is None or hi is None:
        lo, hi = (center - half, center + half) if xs.kind == "step" else (lo or center, hi or center)
    return (lo, hi) if hi > lo else None


def show_compare_controls(key: str, result: LineageResult, *, fleet: data.Fleet,
                          config: ScanConfig) -> tuple[LineageResult | None, Comparison | None]:
    """Compare this run (RESUMED) with a control run of the fleet, as ``klwatch compare`` does: the
    core's ``compare_runs`` from RESUMED's first resume (or a step given)."""
    runs = fleet.runs
    names = data.run_names_cached(fleet, secrets=_secrets)
    others = [k for k in runs if k != key]
    if st.session_state.get("control") not in others:
        st.session_state["control"] = None
    c1, c2 = st.columns([3, 1])
    c1.selectbox("Compare with a control run (a continuous run of the same config)", others, key="control", index=None,
                 placeholder="no comparison", format_func=lambda k: names.get(k, k))
    control_key = st.session_state.get("control")
    if not control_key:
        return None, None
    start = first_resume(result)
    step = c2.number_input("compare from step", value=start if start is not None else 0, step=1, key=f"cmp_from::{key}",
                           help="RESUMED's first resume by default (klwatch compare --from-step).")
    control = runs[control_key]
    cmp = data.comparison_cached(control_key, key, int(step), data.config_key(config), _control=control, _resumed=result)
    return control, cmp


def show_comparison(cmp: Comparison) -> None:
    """The comparison's verdict and why, in the words of ``klwatch compare``."""
    box = {"parted": st.error, "agree": st.success}.get(cmp.verdict, st.info)
    box(f"**Compare: {cmp.verdict}.** {say(cmp.explanation)}", icon=":material/compare_arrows:")
    for w in cmp.warnings:
        st.warning(say(w))


def show_boundaries(verdicts: list[BoundaryVerdict]) -> None:
    """Each resume boundary in step order: its verdict and why, the evidence, the windows compared,
    and the boundary as the JSON report gives it."""
    st.subheader("Resume boundaries")
    if not verdicts:
        st.caption("No resume found in this run.")
    for v in sorted(verdicts, key=lambda v: v.boundary.step):
        b = v.boundary
        with st.expander(f"step {b.step} · {v.verdict} · score {v.score:.2f} · "
                         f"KL {charts.fmt_kl(v.kl_before)} → {charts.fmt_kl(v.kl_after)}", icon=VERDICT_ICON.get(v.verdict)):
            st.markdown(say(v.explanation))
            st.markdown("**Evidence:** " + " ".join(f"`{e}`" for e in b.evidence) +
                        f" · resumed from step {b.resumed_from_step if b.resumed_from_step is not None else 'unknown'}")
            if v.window_before or v.window_after:
                st.markdown(f"Compared steps {_window(v.window_before)} (before) with {_window(v.window_after)} (after).")
            st.json(scrubbed(boundary_dict(v)), expanded=False)


def scrubbed(doc: object) -> object:
    """A JSON document from a run (its config, a boundary) with every credential in it masked: the JSON
    viewer shows text as text, but a run may have logged a token. Each string is scrubbed on its own
    (``report.clean_strings``), so masking can never break the document."""
    plain = json.loads(json.dumps(doc, default=str, allow_nan=True))
    return clean_strings(plain, lambda s: scrub(s, _secrets))


def _members(lin: Lineage) -> list[dict[str, object]]:
    """The run's tracker runs, files and checkpoint folders, each with where its training starts and
    ends (``Segment.extent``: not a setup key's step 0)."""
    prefer = (lin.kl_metric,) if lin.kl_metric else ()
    return [{"kind": seg.kind, "ref": scrub(seg.ref, _secrets), "first_step": first, "last_step": last}
            for seg in lin.segments for first, last in [seg.extent(prefer)]]


def _window(w: tuple[int, int] | None) -> str:
    return "-" if not w else f"{w[0]}–{w[1]}"


def main() -> None:
    st.set_page_config(page_title="klwatch dashboard", page_icon="📉", layout="wide")
    refusal = safety.exposure_refusal(safety.served_address(), os.environ)
    if refusal:  # on every interface without the operator's say-so: serve nothing
        st.error(refusal, icon=":material/lock:")
        st.stop()
    launch = current_launch()
    _secrets[:] = [s for s in launch.sources if redact_spec(s) != s]
    init_state(launch)
    box = sidebar_sources(launch)
    specs = sources_in_view(launch)
    fps = data.fingerprints(specs)
    config = sidebar_config(specs, fps)
    with st.spinner("Reading sources ..."):
        fleet = data.load_fleet(specs, config=config, fps=fps)
    show_sources(box, fleet, launch)
    findings, pending = data.fleet_findings(fleet, config=config, wait=FINDINGS_WAIT_SECONDS)

    st.title("klwatch: resume boundaries")
    show_notices(launch)
    show_source_errors(fleet, launch)
    show_counts(data.fleet_table_cached(fleet, findings))
    show_picture(fleet, config)
    show_fleet_table(fleet, config, findings, pending, launch)
    show_open_run(fleet, config, findings, launch)


def show_run_picker(fleet: data.Fleet, findings: dict[str, list[Finding]]) -> str | None:
    """The run to open: the one asked for (a link's, a click's) when it is in the fleet, else one the
    page opens by itself (``data.auto_open``); None, said, when every run is past the point budget."""
    runs = fleet.runs
    wanted = st.session_state.get("run")
    if wanted not in runs:
        if wanted and st.session_state.get("_linked_run") == wanted:
            st.warning(f"The run {safety.code(safety.shorten(scrub(wanted, _secrets)))} from the link is not in these sources.")
        st.session_state["run"] = data.auto_open(fleet, findings=findings)
    st.divider()
    choices = data.run_choices_cached(fleet, findings, secrets=_secrets)
    run_key = st.selectbox("Run", list(runs), key="run", index=None, placeholder="pick a run to open",
                           format_func=choices.__getitem__)
    if run_key is None:
        st.info(f"No run opened by itself: every run here holds more than {data.POINT_BUDGET:,} points. "
                "Click one in the table (its chart is thinned to a few thousand points per panel).",
                icon=":material/speed:")
    return run_key


FINDINGS_WAIT_SECONDS = 0.3  # a page load waits at most this long for the fleet's findings, then draws and polls

main()
