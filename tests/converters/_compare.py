"""Helpers for comparing converter output with ADP's standardized samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ADP_DIR = Path(__file__).resolve().parents[2] / "samples" / "adp"
FIXTURES = Path(__file__).parent / "fixtures"


def load(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def step_view(step: Any) -> dict[str, Any]:
    """The comparable content of one interlingua step (no thought, no ids, no extras)."""
    kind = step.kind
    view: dict[str, Any] = {"kind": kind}
    if kind == "api":
        view.update(function=step.function, arguments=step.arguments)
    elif kind == "code":
        view.update(language=step.language, content=step.content)
    elif kind == "message":
        view.update(content=step.content)
    elif kind in ("text", "json"):
        view.update(content=step.content, source=step.source, name=step.name)
    elif kind == "image":
        view.update(path=step.image.path, annotations=[a.model_dump() for a in step.image.annotations or []])
    elif kind == "web":
        view.update(url=step.url, html=step.html, axtree=step.axtree, viewport=step.viewport,
                    screenshot=step.screenshot.path if step.screenshot else None)
    return view


def thought_of(step: Any) -> Any:
    return getattr(step, "thought", None)


def _closing_texts() -> set[str]:
    from converters._util import END_AGENT_PHRASES, END_USER_MESSAGES

    texts = set(END_USER_MESSAGES) | {"<finish> </finish>"}
    texts |= {f"<finish> {p} </finish>" for p in END_AGENT_PHRASES}
    return texts


CLOSING = _closing_texts()


def normalized(traj: Any, synthetic: list[int]) -> tuple[list[dict], list[Any]]:
    """Views and thoughts, with ADP's randomly chosen closing turns replaced by a placeholder.

    ADP appends one of five fixed "success" turns at random; we pick one from the id. At the
    indices our converter marks synthetic, any of the fixed variants is accepted.
    """
    views, thoughts = [], []
    for i, step in enumerate(traj.steps):
        view, thought = step_view(step), thought_of(step)
        if i in synthetic and view.get("content") in CLOSING:
            view = {"kind": view["kind"], "closing": True}
            thought = None
        views.append(view)
        thoughts.append(thought)
    return views, thoughts


# module name per registered converter name (imported explicitly so a half-written sibling
# package elsewhere in `converters/` cannot break these tests)
MODULES = {
    "agenttuning_alfworld": "agenttuning_alfworld", "agenttuning_db": "agenttuning_db",
    "agenttuning_kg": "agenttuning_kg", "agenttuning_os": "agenttuning_os",
    "agenttuning_webshop": "agenttuning_webshop", "android_in_the_wild": "android_in_the_wild",
    "code_feedback": "code_feedback", "codeactinstruct": "codeactinstruct", "llava_plus": "llava_plus",
    "mini-coder": "mini_coder", "nebius_SWE-agent-trajectories": "nebius_swe_agent_trajectories",
    "nnetnav-wa": "nnetnav_wa", "orca_agentinstruct": "orca_agentinstruct",
    "swe-gym_openhands_sampled_trajectories": "swe_gym_openhands_sampled_trajectories",
    "swe-smith": "swe_smith", "synatra": "synatra", "toucan_1_5m": "toucan_1_5m",
    "webarena_successful": "webarena_successful", "go-browse-wa": "go_browse_wa",
    "xlam": "xlam", "xlam_fc": "xlam_fc", "apigen_mt": "apigen_mt",
    "agenttuning_mind2web": "agenttuning_mind2web", "androidcontrol": "androidcontrol", "eto": "eto",
    "nnetnav-live": "nnetnav_live", "omniact": "omniact", "screenagent": "screenagent",
    "swe-play-trajectories": "swe_play_trajectories", "turkingbench": "turkingbench",
}


def module(name: str) -> Any:
    import importlib

    return importlib.import_module(f"converters.{MODULES[name]}")


def available() -> list[str]:
    """Registered names whose module exists."""
    import importlib.util

    return [n for n, m in MODULES.items() if importlib.util.find_spec(f"converters.{m}") is not None]


def units(name: str, raws: list[Any]) -> list[Any]:
    """Raw rows -> the records a converter takes (episodes of step rows, items of session lists)."""
    from converters.registry import get_converter

    return list(get_converter(name).records(raws))


def sample_datasets() -> list[str]:
    """Datasets with a shipped raw sample and ADP's standardized version of it."""
    return sorted(p.parent.name for p in ADP_DIR.glob("*/sample_raw.json") if (p.parent / "sample_std.json").exists())


def assert_matches_adp(name: str, out: list[Any]) -> None:
    """`out` (our conversion of the dataset's sample_raw.json) equals ADP's sample_std.json step by step
    (kinds, contents, arguments, observations and thoughts; the normalizations are listed in
    test_samples.py)."""
    from converters.adp import from_adp

    stds = [from_adp(s, name) for s in load(ADP_DIR / name / "sample_std.json")]
    if name == "webarena_successful":
        std_views = [normalized(s, [])[0] for s in stds]
        for t in out:
            assert normalized(t, [])[0] in std_views, t.id
        return
    if name == "synatra":
        assert len(out) == len(stds)
        pairs = list(zip(out, stds))
    elif name == "turkingbench":
        first: dict[str, Any] = {}
        for s in stds:
            first.setdefault(s.provenance.source_id, s)
        assert {t.provenance.source_id for t in out} == set(first)
        pairs = [(t, first[t.provenance.source_id]) for t in out]
    else:
        by_id: dict[str, list[Any]] = {}
        for s in stds:
            by_id.setdefault(s.provenance.source_id, []).append(s)
        pairs = [(t, by_id[t.provenance.source_id].pop(0)) for t in out if by_id.get(t.provenance.source_id)]
        assert len(pairs) == len(stds), "every standardized record has a converted counterpart"
    for ours, std in pairs:
        syn = ours.details.get("synthetic_steps", [])
        a, ta = normalized(ours, syn)
        b, tb = normalized(std, syn)
        if name == "nnetnav-wa":
            n = len(b) - 1
            a, ta = a[:1] + a[len(a) - n :], ta[:1] + ta[len(ta) - n :]
        assert len(a) == len(b), ours.id
        for i, (x, y) in enumerate(zip(a, b)):
            assert x == y, f"{ours.id} step {i}:\n ours {json.dumps(x)[:300]}\n std  {json.dumps(y)[:300]}"
        assert ta == tb, ours.id
