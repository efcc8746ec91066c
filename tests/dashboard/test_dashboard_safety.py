"""What a dashboard link can do (issue 13), through Streamlit's AppTest and the policy itself: a link
chooses among the operator's sources and never names a new path or host; adding a source is off
unless an allow-list was given at launch, and then confined to it; a credential in a launch source
never reaches the page; text from a source or a link renders as text; a server on every interface
serves nothing without the operator's opt-in."""

from __future__ import annotations

import html
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as hs
from google.protobuf.message import Message
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from klwatch.dashboard import data, safety
from klwatch.dashboard.safety import AllowList, Launch, select_sources
from klwatch.pipeline import ScanConfig, scan

from dashboard_runs import write_fleet, write_mlflow_store, write_run

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
PASSWORD = "Pl4nted-Passw0rd-913"
TOKEN = "Pl4nted-Token-5521"
PRIVATE_RUN = "private-run-0xC0FFEE"
PAYLOAD = ("![x](http://attacker.invalid/x.png) <img src=http://attacker.invalid/i.png> "
           "[link](javascript:alert(1)) :red[red] :material/home: $x$ <b>b</b> `tick")
_md = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


# ---------------------------------------------------------------- the pieces


def _rendered(markdown: str) -> str:
    """CommonMark with raw HTML allowed: what a renderer that trusted the text would make of it."""
    return _md.render(markdown)


def _text(rendered: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", rendered)).replace(safety.WORD_JOINER, "").strip()


@given(hs.text(max_size=80))
@example("    indented like code")
@example("- a list\n# a heading\n> a quote\n1) one\n    ---")
@example("**x** _y_ ~~z~~ | a | b |\n|---|---| <!-- c --> &amp; &#60;b&#62;")
def test_any_text_renders_as_itself_and_nothing_else(text: str) -> None:
    out = _rendered(safety.md(text))
    assert re.sub(r"</?p>", "", out).count("<") == 0, out  # no element but the paragraph
    assert _text(out) == safety.plain(text).strip()


@given(hs.text(max_size=60))
def test_a_code_span_holds_any_text(text: str) -> None:
    out = _rendered("x " + safety.code(text))
    assert re.sub(r"</?(p|code)>", "", out).count("<") == 0, out
    assert _text(out)[1:].strip() == safety.plain(text).strip()


def test_hostile_markdown_makes_no_image_link_or_html() -> None:
    for shown in (safety.md(PAYLOAD), safety.code(PAYLOAD), safety.md("1. " + PAYLOAD), safety.md("# " + PAYLOAD)):
        out = _rendered(shown)
        assert "<img" not in out and "<a " not in out and "<b>" not in out and "<h1" not in out and "<ol" not in out
    assert "http:" not in safety.md("see http://x.y/z")  # no bare URL for an autolinker: a joiner inside it
    assert safety.md("tab\there\nnewline\x1b[31m") == "tab here newline \\[31m"


def test_plot_text_shows_tags_as_text_and_fills_in_no_template() -> None:
    shown = safety.plot_text("<img src=x> <a href='javascript:1'>a</a> %{customdata[0]} & \u202eevil")
    assert "<" not in shown and ">" not in shown and "%{" not in shown
    assert "&lt;img src=x&gt;" in shown and "&amp;" in shown and "\u202e" not in shown


def test_the_allow_list_admits_only_what_lies_under_its_roots_and_hosts(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root, private = tmp_path / "root", tmp_path / "private"
    (root / "team" / "runs").mkdir(parents=True)
    private.mkdir()
    (root / "escape").symlink_to(private)
    allow = AllowList.parse([str(root), "mlflow://tracking.internal:5000", "mlflow://any-port.internal",
                             "wandb://team/rl"])
    real = os.path.realpath(root)
    assert allow.admit(str(root / "team" / "runs")) == (f"{real}/team/runs", "")
    assert allow.admit(f"{root}/team/../team/runs#grpo-*") == (f"{real}/team/runs#grpo-*", "")
    monkeypatch.chdir(root)
    assert allow.admit("team") == (f"{real}/team", "")  # relative: resolved where the server runs
    for outside in (f"{root}/../private", f"{root}/escape", f"{root}/escape/x", "/etc", "/", "..", "#x", " "):
        spec, why = allow.admit(outside)
        assert spec is None and why, outside
    assert allow.admit("mlflow://tracking.internal:5000/grpo")[0] == "mlflow://tracking.internal:5000/grpo"
    assert allow.admit("mlflow+https://TRACKING.internal:5000")[0]
    assert allow.admit("mlflow://any-port.internal:1234")[0]
    for host in ("mlflow://tracking.internal:5001", "mlflow://evil.example:5000", "mlflow://tracking.internal.evil:5000",
                 "mlflow://u:p@tracking.internal:5000", "mlflow://tracking.internal@evil.example:5000",
                 "mlflow://tracking.internal:5000?x=1", "http://tracking.internal:5000", "file:///etc",
                 "wandb://team/other", "wandb://evil/rl", "wandb://team", "wandb://team/rl/../../x"):
        assert allow.admit(host)[0] is None, host
    assert allow.admit("wandb://team/rl/run-42#x")[0] == "wandb://team/rl/run-42#x"
    assert AllowList().admit(str(root))[0] is None  # no allow-list: adding is off


def test_allow_list_entries_that_are_not_a_folder_or_a_host_are_refused(tmp_path: Path) -> None:
    for bad in (str(tmp_path / "missing"), "ftp://host", "wandb://a/b/c"):
        with pytest.raises(ValueError):
            AllowList.parse([bad])
    launch = safety.launch_settings([], {safety.ALLOW_ADD_ENV: f"{tmp_path}\nftp://host"}, app_file=APP, default=["x"])
    assert launch.allow.roots == (Path(os.path.realpath(tmp_path)),) and len(launch.problems) == 1


def test_the_operator_names_the_sources_on_the_command_line_or_in_the_environment(tmp_path: Path) -> None:
    argv = [APP, "--allow-add", str(tmp_path), "runs/", f"--allow-add={tmp_path}", "mlflow://h:1"]
    launch = safety.launch_settings(argv, {safety.SOURCES_ENV: "ignored/"}, app_file=APP, default=["sample/"])
    assert launch.sources == ("runs/", "mlflow://h:1") and len(launch.allow.roots) == 2
    other = safety.launch_settings(["pytest", "x"], {safety.SOURCES_ENV: "a/\n\n b/ \n"}, app_file=APP, default=["s/"])
    assert other.sources == ("a/", "b/") and not other.allow.enabled
    assert safety.launch_settings([], {}, app_file=APP, default=["s/"]).sources == ("s/",)


def test_a_link_chooses_among_launch_sources_by_their_redacted_names() -> None:
    secret = f"mlflow://alice:{PASSWORD}@tracking:5000"
    launch = Launch(("runs/", secret, "other/"))
    assert launch.labels[secret] == "mlflow://***@tracking:5000"
    chosen = select_sources(["mlflow://***@tracking:5000", "/etc", "runs/"], launch)
    assert chosen.shown == ["runs/", secret] and chosen.added == [] and chosen.ignored == ["/etc"]
    link = safety.link_sources(chosen.shown, chosen.added, launch)
    assert link == ["runs/", "mlflow://***@tracking:5000"] and PASSWORD not in "".join(link)
    assert select_sources(link, launch).shown == chosen.shown  # the link opens the same view
    assert select_sources([secret], launch).shown == [secret]  # whoever knows the secret may use it
    assert select_sources(["nothing"], launch).shown == list(launch.sources)
    assert safety.link_sources(list(launch.sources), [], launch) == []  # every source: no parameter at all


def test_a_server_on_every_interface_needs_the_operators_opt_in() -> None:
    for address in ("", "0.0.0.0", "::"):
        refusal = safety.exposure_refusal(address, {})
        assert refusal and "KLWATCH_DASHBOARD_PUBLIC=1" in refusal and "--address 0.0.0.0" in refusal
        assert safety.exposure_refusal(address, {safety.PUBLIC_ENV: "1"}) is None
    for address in (None, "127.0.0.1", "localhost", "::1", "10.1.2.3"):
        assert safety.exposure_refusal(address, {}) is None
    assert safety.is_loopback("127.0.0.2") and safety.is_loopback("[::1]") and not safety.is_loopback("0.0.0.0")


def test_the_exported_report_names_a_source_without_its_credentials(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    secret = f"mlflow://alice:{PASSWORD}@127.0.0.1:{_closed_port()}"
    fleet = data.load_fleet([secret, str(write_fleet(tmp_path))], config=ScanConfig())
    text = data.report_json(fleet.scan, secrets=[secret])
    assert PASSWORD not in text and TOKEN not in text and "alice" not in text
    assert '"spec": "mlflow://***@127.0.0.1:' in text
    table = data.fleet_table(fleet).to_csv()
    assert PASSWORD not in table


# ---------------------------------------------------------------- the page


def _closed_port() -> int:
    """A loopback port nothing listens on (a connection is refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _app(monkeypatch: pytest.MonkeyPatch, *sources: str, allow: str = "", **query: str | list[str]) -> AppTest:
    monkeypatch.setenv(safety.SOURCES_ENV, "\n".join(sources))
    if allow:
        monkeypatch.setenv(safety.ALLOW_ADD_ENV, allow)
    else:
        monkeypatch.delenv(safety.ALLOW_ADD_ENV, raising=False)
    at = AppTest.from_file(APP, default_timeout=120)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def _protos(node) -> Iterator[Message]:
    proto = getattr(node, "proto", None)
    if proto is not None:
        yield proto
    children = getattr(node, "children", None) or {}
    for child in (children.values() if isinstance(children, dict) else children):
        yield from _protos(child)


def _page(at: AppTest) -> str:
    """Everything the page sends the browser (every element's message, the tables' bytes included)."""
    return "\n".join(str(p) for p in _protos(at._tree))


def _strings(msg: Message, names: set[str]) -> Iterator[str]:
    for fd, value in msg.ListFields():
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        values = value if repeated else [value]
        for v in values:
            if fd.type == fd.TYPE_MESSAGE:
                yield from _strings(v, names)
            elif fd.type == fd.TYPE_STRING and fd.name in names:
                yield v


def _markdown(at: AppTest) -> list[str]:
    """Every text the page renders as markdown: bodies, labels and help texts of every element."""
    plain = {"Json", "Code", "Text", "PlotlyChart", "Arrow"}  # shown as text, never as markdown
    return [t for p in _protos(at._tree) if p.DESCRIPTOR.name not in plain
            for t in _strings(p, {"body", "label", "help"})]


def _qp(at: AppTest, key: str) -> list[str]:
    value = at.query_params.get(key, [])
    return [value] if isinstance(value, str) else list(value)


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fleet(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="module")
def private_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("private")
    write_run(root, name=PRIVATE_RUN, resumes=[41], buggy=True, steps=80, extra=False)
    return root


def test_a_link_naming_other_paths_or_hosts_reads_nothing_of_them(monkeypatch: pytest.MonkeyPatch, fleet_dir: Path,
                                                                  private_dir: Path) -> None:
    with socket.socket() as recorder:
        recorder.bind(("127.0.0.1", 0))
        recorder.listen(8)
        recorder.setblocking(False)
        host = f"mlflow://127.0.0.1:{recorder.getsockname()[1]}"
        at = _app(monkeypatch, str(fleet_dir), src=["/etc", str(private_dir), host, f"{private_dir}#*", PAYLOAD])
        with pytest.raises(BlockingIOError):
            recorder.accept()  # the server a link named was never contacted
    assert not at.exception
    assert set(at.dataframe(key="fleet_table").value["run"]) == {"grpo-resume-buggy", "grpo-resume-fixed", "grpo-continuous"}
    page = _page(at)
    assert PRIVATE_RUN not in page and "passwd" not in page
    [notice] = [w.value for w in at.warning if "Ignored from the link" in w.value]
    assert "`/etc`" in notice and host in notice
    assert "src" not in at.query_params  # the ignored values are not carried on in the link
    for text in _markdown(at):
        assert "<img" not in _rendered(text) and "<a " not in _rendered(text), text


def test_a_link_selects_among_the_launch_sources_and_reopens_the_same_view(monkeypatch: pytest.MonkeyPatch,
                                                                           fleet_dir: Path, private_dir: Path) -> None:
    at = _app(monkeypatch, str(fleet_dir), str(private_dir), src=str(private_dir))
    assert list(at.dataframe(key="fleet_table").value["run"]) == [PRIVATE_RUN]
    assert at.multiselect(key="shown_sources").value == [str(private_dir)]
    assert _qp(at, "src") == [str(private_dir)]
    at.multiselect(key="shown_sources").set_value([]).run()  # none picked: every launch source
    assert len(at.dataframe(key="fleet_table").value) == 4 and "src" not in at.query_params


def test_a_launch_source_with_credentials_is_shown_redacted_everywhere(monkeypatch: pytest.MonkeyPatch,
                                                                       fleet_dir: Path) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", TOKEN)
    secret = f"mlflow://alice:{PASSWORD}@127.0.0.1:{_closed_port()}"
    label = safety.Launch((secret,)).labels[secret]
    at = _app(monkeypatch, str(fleet_dir), secret)
    page = _page(at)
    assert PASSWORD not in page and TOKEN not in page and "alice" not in page
    assert any("could not be read" in e.value and "127.0.0.1" in e.value for e in at.error)
    at = _app(monkeypatch, str(fleet_dir), secret, src=label)  # a link names it by what the page shows
    assert at.multiselect(key="shown_sources").value == [label]
    assert PASSWORD not in _page(at) and _qp(at, "src") == [label]


def test_adding_a_source_is_off_unless_allowed_and_then_stays_under_the_allowed_roots(
        monkeypatch: pytest.MonkeyPatch, fleet_dir: Path, private_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_run(root / "team", name="team-run", resumes=[], buggy=False, steps=40, extra=False)
    (root / "escape").symlink_to(private_dir)
    team = os.path.realpath(root / "team")
    off = _app(monkeypatch, str(fleet_dir), src=team)
    assert not [t for t in off.text_input if t.key == "new_source"]
    assert "team-run" not in _page(off) and any("Ignored from the link" in w.value for w in off.warning)

    at = _app(monkeypatch, str(fleet_dir), allow=str(root))
    for outside in (f"{root}/../{private_dir.name}", str(root / "escape"), f"{root}/escape/../team",
                    str(private_dir), "/etc", "mlflow://127.0.0.1:9"):
        at.text_input(key="new_source").input(outside).run()
        assert any("Not added" in e.value for e in at.error), outside
        assert PRIVATE_RUN not in _page(at) and "src" not in at.query_params
    at.text_input(key="new_source").input(f"{root}/team/../team").run()  # resolved: inside the root
    assert "team-run" in set(at.dataframe(key="fleet_table").value["run"])
    assert _qp(at, "src") == [team]
    shared = _app(monkeypatch, str(fleet_dir), allow=str(root), src=[team, str(private_dir)])  # the link, opened
    assert "team-run" in set(shared.dataframe(key="fleet_table").value["run"])
    assert PRIVATE_RUN not in _page(shared)


def test_run_names_configs_and_links_render_as_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = write_mlflow_store(tmp_path, run_name=PAYLOAD, experiment="<b>exp</b>", param=PAYLOAD)
    (key,) = [r.lineage.id for r in scan([str(store)]).results]
    at = _app(monkeypatch, str(store), run=key)
    assert not at.exception and at.selectbox(key="run").value == key
    (header,) = [h.value for h in at.header if "attacker" in h.value]
    assert _text(_rendered(header)).endswith(safety.plain(PAYLOAD).strip())  # the name, as written
    for text in _markdown(at):
        out = _rendered(text)
        assert "<img" not in out and "<a " not in out and "<b>" not in out, text
    spec = [c.proto.spec for c in at.get("plotly_chart")]
    assert spec and all("<img" not in s and "<b>exp" not in s for s in spec)
    at = _app(monkeypatch, str(store), run=f"<img src=http://attacker.invalid/r.png>{key}")
    assert any("from the link is not in these sources" in w.value for w in at.warning)
    assert all("<img" not in _rendered(w.value) for w in at.warning)


def test_a_server_on_every_interface_serves_nothing_without_the_opt_in(monkeypatch: pytest.MonkeyPatch,
                                                                       fleet_dir: Path) -> None:
    monkeypatch.setattr(safety, "served_address", lambda: "")  # Streamlit's default: every interface
    monkeypatch.delenv(safety.PUBLIC_ENV, raising=False)
    at = _app(monkeypatch, str(fleet_dir))
    assert "every network interface" in at.error[0].value
    assert not at.dataframe and "grpo-resume-buggy" not in _page(at)
    monkeypatch.setenv(safety.PUBLIC_ENV, "1")
    assert len(_app(monkeypatch, str(fleet_dir)).dataframe(key="fleet_table").value) == 3
