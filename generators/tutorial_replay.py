"""Tutorial-guided replay (AgentTrek): tutorials -> filtered -> task specs -> replayed on real pages -> judged.

The tutorial's text defines the task: nothing is mapped onto a built-in task template. Per
tutorial (one method task per tutorial, id = the tutorial's id), in any environment that offers
pages (`browser`: real pages in Chromium; `simulated` in web mode; the `web` shop):

1. **prefilter**: a cheap keyword test (config `keywords`, whole words, case folded); a text with
   none of them is filtered by "prefilter" ("no keyword").
2. **classifier**: the model sees the text and the sites the environment serves (config `sites`:
   name and description) and answers `{is_tutorial, site, reason}`, `site` one of the served
   sites' names or "none". Not a tutorial, or a tutorial for a site not served: filtered by
   "classifier" with the model's reason.
3. **spec**: the model turns the tutorial into `{start_url, goal, prerequisites, steps,
   expected_outcome}` for that site. The start page is resolved against the site (`start_page`):
   a path resolves against the site's `url` (itself relative to the environment's
   `site_dir` / `base_url`, which the environment resolves), a full URL must be on the site (its
   host, or one of its public `hosts`, whose paths map onto the served copy); on a MiniWoB++ site
   it names a task page (`login-user`). A start page that cannot be resolved: filtered by "spec".
4. **replay**: a fresh episode of a task whose instruction is the spec's goal (the trajectory's
   first user turn) opening on the start page; the agent (`self.policy()`: the environment's
   policy where it has one) has the spec in its system prompt as guidance, and acts through the
   one episode loop until the episode ends or `max_steps`. A MiniWoB page is seeded (`seed` + the
   replay index) and gives its own reward; other pages have no check of their own.
5. **judge**: the judge model (`judge.llm`) sees, as AgentTrek's evaluator, the task, the tutorial's
   expected outcome and what the world showed in the replay: every agent action (without its thoughts,
   `filters.world_view`; `judge.self_report: true` adds them) with the page it led to (URL, screenshot
   path, accessibility tree cut at `max_step_page_chars`), the agent's final answer and the final page in
   full; with `judge.vision` the screenshots of the replay go along in order (up to `max_judge_images`,
   see `filters.vision`). It answers `{reason, success}`.
6. **keep**: `success` comes from the environment's own check where the task has one (MiniWoB's
   reward; `success_from: env`, the default) and from the judge otherwise (or always, with
   `success_from: judge`); their agreement is recorded and counted. An unsuccessful replay is
   filtered by "outcome" with the reason (`keep_failed` keeps it).

The trajectory's steps are the episode: the agent's system prompt, the goal as the user's request, the
pages, the actions. The agent replayed with the spec in its system prompt, but the trained agent will act
from the goal alone: by default (`train_prompt: goal`) the record's system prompt is the agent's own
without the tutorial, the prompt it replayed with is kept in `details.replay_prompt`, and the actions are
declared `context` rewrites (answered to another prompt); `train_prompt: replay` keeps the replay's
prompt. Replay k is the agent's draw k (its own sampling seed); no attempt marker enters the prompt. The
tutorial, classifier verdict, spec and judge verdict live in `details`. A tutorial
dropped before any replay is recorded in `filtered/` with its text, so nothing vanishes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal
from urllib.parse import urljoin, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from backends.errors import LLMRequestError
from envs.base import Evaluation, Task
from filters.step_judge import cut_head, describe_page, numbered_path, screenshots
from filters.vision import PageImages
from generators._episode import Episode, play_episode
from generators.base import Role, RoleModel, TaskResult, TaskSpec
from generators.env_method import EnvMethod, EnvMethodConfig
from generators.failures import episode_failure
from generators.registry import register_method
from filters.grounding import quoted, visible_text
from filters.world_view import SELF_REPORT, WORLD, judged_steps
from schemas.models import Rewrite, Step, TextObservation, Trajectory, WebObservation, is_system_step
from schemas.store import Dataset

REPO = Path(__file__).resolve().parents[1]
NO_SITE = "none"
SOURCE = "tutorial"

CLASSIFY_SYSTEM = (
    "You sort web texts for an agent-training pipeline. Decide whether the text is a step-by-step "
    "tutorial (a how-to a person or an agent could follow in a web browser) and which of the sites "
    "below it is written for; answer \"none\" when it is for another site or for no site at all.\n\n"
    "Sites:\n{sites}\n\nAnswer with a JSON object {{\"is_tutorial\": bool, \"site\": str, \"reason\": str}}."
)
CLASSIFY_USER = "CLASSIFY THIS TEXT\nTitle: {title}\n\n{text}"
SPEC_SYSTEM = (
    "You turn a tutorial into a task an agent will carry out in a web browser on the site {site} "
    "({description}). {start}\nAnswer with a JSON object {{\"start_url\": str, \"goal\": str, "
    "\"prerequisites\": [str], \"steps\": [str], \"expected_outcome\": str}}: goal is the task as a user "
    "would ask for it, in one or two sentences, with the concrete values the tutorial uses; steps are "
    "short imperative sentences that say what to click, type or select.\n\nBrowser actions:\n{tools}"
)
SPEC_START_PAGES = ("start_url is the page the tutorial starts on, as it names it: a path on the site or a "
                    "full URL (empty for the site's home page).")
SPEC_START_MINIWOB = "start_url is the name of the MiniWoB++ task page the tutorial is about (e.g. login-user)."
SPEC_USER = "WRITE THE TASK SPEC\nTitle: {title}\n\n{text}"
GUIDANCE = (
    "A tutorial for {site} describes how to do this task. Follow it step by step, adapting to what the "
    "pages show.\nGoal: {goal}\nPrerequisites:\n{prerequisites}\nSteps:\n{steps}\nExpected outcome: {expected_outcome}"
)
JUDGE_SYSTEM = (
    "You judge whether a web agent accomplished a task it learned from a tutorial. You see the task, the "
    "outcome the tutorial expects and the whole replay: every action of the agent with the page it led to "
    "(URL, screenshot path, accessibility tree; the screenshots themselves, in order, when attached), its final "
    "answer, and the final page in full. Judge by what the pages show: what the agent says counts only where "
    "the pages confirm it. "
    "Answer with a JSON object {\"reason\": str, \"success\": bool}: success is true only if the task was done."
)
JUDGE_USER = (
    "JUDGE THIS REPLAY\nTask: {instruction}\nExpected outcome: {expected_outcome}\n\n"
    "# Replay (agent steps are numbered; SEEN: what each step led to)\n{log}\n\n"
    "# Final answer of the agent\n{answer}\n\n# Final page\n{page}"
)

DEFAULT_KEYWORDS = [
    "click", "button", "link", "page", "type", "select", "menu", "form", "field", "checkbox", "tick", "tab",
    "log in", "sign in", "website", "browser", "search", "cart", "url",
]


class TutorialSite(BaseModel):
    """A site the environment serves, which tutorials may be written for."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="what the classifier answers")
    description: str = Field(min_length=1, description="what the site is, for the classifier and the spec writer")
    url: str = Field("", description="its home page: relative to the env's site_dir / base_url, or absolute")
    hosts: list[str] = Field(default_factory=list,
                             description="public host names of the site: tutorials' URLs on them open the served copy")
    miniwob: bool = Field(False, description="MiniWoB++ task pages (browser env): start pages name a task page")

    @model_validator(mode="after")
    def _one_kind(self) -> TutorialSite:
        if self.name == NO_SITE:
            raise ValueError(f"a site may not be named {NO_SITE!r} (the classifier's answer for no served site)")
        if self.miniwob and (self.url or self.hosts):
            raise ValueError(f"site {self.name}: a MiniWoB++ site takes no url or hosts (its pages are served locally)")
        self.hosts = [h.lower() for h in self.hosts]
        return self


class TutorialReplayConfig(EnvMethodConfig):
    """Tutorials replayed on the pages of the environment's sites."""

    method: Literal["tutorial_replay"] = "tutorial_replay"
    requires: ClassVar[frozenset[str]] = frozenset({"pages"})
    env: str = Field("browser", description="an environment that offers pages (browser, simulated in web mode, web)")
    tutorials: list[str] = Field(default_factory=lambda: ["samples/tutorials"],
                                 description="JSONL files of {id, title, text}, Markdown files, or folders of them")
    sites: list[TutorialSite] = Field(min_length=1, description="the sites the environment serves")
    keywords: list[str] = Field(default_factory=lambda: list(DEFAULT_KEYWORDS),
                                description="prefilter: a tutorial needs at least one (whole words, any case)")
    max_tutorials: int | None = Field(None, ge=1)
    max_tutorial_chars: int = Field(4000, ge=200, description="longer tutorial texts are cut")
    replays: int = Field(1, ge=1, description="replays (trajectories) per kept tutorial")
    success_from: Literal["env", "judge"] = Field(
        "env", description="env: the environment's own check decides where the task has one, else the judge")
    keep_failed: bool = False
    tutorial_quotes: Literal["strip", "drop"] = Field(
        "strip", description="train_prompt goal: a thought that quotes the tutorial (a span of 8 words or an id the "
                             "goal-only context lacks) is removed, the action kept (strip), or the replay dropped "
                             "(drop); a final message that quotes it drops the replay either way")
    train_prompt: Literal["goal", "replay"] = Field(
        "goal", description="goal: the record's system prompt is the agent's own, without the tutorial (the trained "
                            "agent acts from the goal alone; the prompt it replayed with is kept in "
                            "details.replay_prompt and the rewrite declared); replay: the prompt it replayed with")
    teacher: RoleModel = Field(default_factory=RoleModel, description="the model that classifies tutorials and writes "
                                                                      "their specs; default: the judge model")
    max_log_chars: int = Field(6000, ge=500, description="of the replay's steps the judge reads (their end)")
    max_step_page_chars: int = Field(1500, ge=100, description="of each page's text in the replay the judge reads")
    max_page_chars: int = Field(12000, ge=500, description="of the final page's text the judge reads")
    max_judge_images: int = Field(8, ge=1, description="screenshots of the replay shown to a judge that takes images "
                                                       "(judge.vision): the first page's and the last ones")

    @model_validator(mode="after")
    def _sites_can_be_opened(self) -> TutorialReplayConfig:
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ValueError(f"sites: duplicate names in {names}")
        served = bool(self.env_config.get("site_dir") or self.env_config.get("base_url"))
        for site in self.sites:
            if site.miniwob and self.env != "browser":
                raise ValueError(f"site {site.name}: MiniWoB++ pages need env: browser, not {self.env!r}")
            if self.env == "browser" and not site.miniwob and not urlsplit(site.url).scheme and not served:
                raise ValueError(f"site {site.name}: its pages are relative (url {site.url!r}); set "
                                 "env_config.site_dir or env_config.base_url, or give the site an absolute url")
        return self


class TaskSpecification(BaseModel):
    """The spec the model writes from a tutorial (the site is the classifier's)."""

    start_url: str = ""
    goal: str = Field(min_length=1)
    prerequisites: list[str] = Field(default_factory=list)
    steps: list[str] = Field(min_length=1)
    expected_outcome: str = ""


class JudgeVerdict(BaseModel):
    reason: str = Field(description="what the log and the final page show, in one or two sentences")
    success: bool


def classification_model(sites: list[str]) -> type[BaseModel]:
    """The classifier's answer, its `site` limited to the served sites' names and "none" (a JSON Schema enum)."""
    return create_model(  # type: ignore[call-overload, no-any-return]
        "TutorialClassification",
        is_tutorial=(bool, ...),
        site=(Literal[tuple([*sites, NO_SITE])], ...),
        reason=(str, ...),
    )


# ---- tutorials -----------------------------------------------------------------------------------

def _resolve(path: str) -> Path:
    p = Path(path)
    if not p.is_absolute() and not p.exists() and (REPO / p).exists():
        return REPO / p  # the shipped samples, when run from elsewhere
    return p


def _markdown(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    heading = re.search(r"^#\s+(.+)$", text, re.MULTILINE)
    return {"id": path.stem, "title": heading.group(1).strip() if heading else path.stem, "text": text}


def load_tutorials(sources: Iterable[str]) -> list[dict[str, str]]:
    """Tutorials as {id, title, text}, in a stable order; duplicate ids are an error."""
    out: list[dict[str, str]] = []
    for source in sources:
        path = _resolve(source)
        files = sorted(path.iterdir()) if path.is_dir() else [path]
        for f in files:
            if f.name.lower() == "readme.md" or f.is_dir():
                continue
            if f.suffix in (".md", ".markdown", ".txt"):
                out.append(_markdown(f))
            elif f.suffix == ".jsonl":
                for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    if not isinstance(row, dict) or not row.get("id") or not isinstance(row.get("text"), str):
                        raise ValueError(f"{f}:{n}: a tutorial needs an 'id' and a 'text'")
                    out.append({"id": str(row["id"]), "title": str(row.get("title") or row["id"]), "text": row["text"]})
            elif path.is_file():
                raise ValueError(f"{f}: tutorials are .jsonl or Markdown files")
    ids = [t["id"] for t in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ValueError(f"duplicate tutorial ids: {', '.join(dup)}")
    return out


# ---- start pages ---------------------------------------------------------------------------------

def start_page(site: TutorialSite, start_url: str) -> tuple[dict[str, Any] | None, str]:
    """The task params that open `start_url` on `site` (`start_url` or `miniwob`), or None and why not."""
    start = start_url.strip()
    if site.miniwob:
        from envs.browser import miniwob

        name = urlsplit(start).path.rstrip("/").rsplit("/", 1)[-1].removesuffix(".html")
        if name not in miniwob.page_names():
            return None, f"no MiniWoB++ task page {name!r} (from start_url {start_url!r})"
        return {"miniwob": name}, ""
    parts = urlsplit(start)
    if parts.scheme and parts.scheme not in ("http", "https"):
        return None, f"start_url {start_url!r} is not a web page"
    if parts.netloc:
        home = urlsplit(site.url)
        if home.netloc and parts.netloc.lower() == home.netloc.lower():
            return {"start_url": start}, ""
        if (parts.hostname or "") not in site.hosts:
            return None, f"start_url {start_url!r} is not on site {site.name}"
        # A URL of the public site opens the same page of the served copy.
        path = urlunsplit(("", "", parts.path or "/", parts.query, parts.fragment))
        return {"start_url": urljoin(site.url, path) if home.netloc else path}, ""
    if not start:
        return {"start_url": site.url or "/"}, ""
    return {"start_url": urljoin(site.url, start) if site.url else start}, ""


def final_answer(steps: list[Step]) -> str | None:
    """The agent's last message (a final answer, or `send_msg_to_user`'s text)."""
    for step in reversed(steps):
        if step.kind == "message" and not step.extra.get("kind"):
            return step.content
        if step.kind == "api" and step.function == "send_msg_to_user":
            return str(step.arguments.get("text", ""))
    return None


@register_method
class TutorialReplay(EnvMethod):
    """AgentTrek: tutorials -> filtered -> task specs -> replayed on the environment's pages -> judged."""

    name = "tutorial_replay"
    Config = TutorialReplayConfig
    templates = (CLASSIFY_SYSTEM, CLASSIFY_USER, SPEC_SYSTEM, SPEC_START_PAGES, SPEC_START_MINIWOB, SPEC_USER,
                 GUIDANCE, JUDGE_SYSTEM, JUDGE_USER)
    uses_task_source: ClassVar[bool] = False
    config: TutorialReplayConfig
    roles = (Role("classifier", "keeps the tutorials and names their sites", ("teacher", "judge")),
             Role("spec writer", "turns a tutorial into a task spec", ("teacher", "judge")),
             Role("judge", "grades each replay", ("judge",)))

    def __init__(self, config: TutorialReplayConfig, llm: Any):
        super().__init__(config, llm)
        self.sites = {s.name: s for s in config.sites}
        self.classification = classification_model(list(self.sites))
        self._keywords = [re.compile(rf"(?<!\w){re.escape(k.lower())}(?!\w)") for k in config.keywords]
        self.images = PageImages(None, config.judge.vision)

    def prepare(self, output: Dataset) -> None:
        super().prepare(output)
        self.images = PageImages(Path(output.path), self.config.judge.vision)  # screenshots sit beside the shards

    def tasks(self) -> Iterable[TaskSpec]:
        tutorials = load_tutorials(self.config.tutorials)
        if self.config.max_tutorials is not None:
            tutorials = tutorials[: self.config.max_tutorials]
        for t in tutorials:
            yield TaskSpec(id=t["id"], instruction=t["title"], payload={"title": t["title"], "text": t["text"]})

    def prefilter(self, text: str) -> list[str]:
        """The keywords that appear in `text`."""
        low = text.lower()
        return [k for k, pattern in zip(self.config.keywords, self._keywords) if pattern.search(low)]

    def _stub(self, task: TaskSpec, **details: Any) -> Trajectory:
        """A record for a tutorial dropped before any replay, so nothing vanishes."""
        return Trajectory(
            id=f"{self.name}/{task.id}",
            source=self.name,
            steps=[TextObservation(content=task.payload["text"][: self.config.max_tutorial_chars], source="user")],
            provenance=self.provenance(task.id).model_copy(update={"source_id": task.id}),
            details={"tutorial": {"id": task.id, "title": task.payload["title"]}, **details},
        )

    # ---- the pipeline -------------------------------------------------------------------------

    async def run_task(self, task: TaskSpec) -> TaskResult:
        result = TaskResult()
        title, text = task.payload["title"], task.payload["text"][: self.config.max_tutorial_chars]
        matched = self.prefilter(f"{title}\n{text}")
        if not matched:
            result.reject(self._stub(task), "prefilter", "no keyword: none of the prefilter's keywords appears")
            return result
        try:
            await self._after_prefilter(task, title, text, matched, result)
        except LLMRequestError as exc:
            result.fail(task.id, "llm", str(exc), {"tutorial": task.id})
        return result

    async def _after_prefilter(self, task: TaskSpec, title: str, text: str, matched: list[str],
                               result: TaskResult) -> None:
        sites = "\n".join(f"- {s.name}: {s.description}" for s in self.sites.values())
        verdict: Any = await self.model_for("classifier").structured(
            [{"role": "system", "content": CLASSIFY_SYSTEM.format(sites=sites)},
             {"role": "user", "content": CLASSIFY_USER.format(title=title, text=text)}], self.classification)
        if verdict is None:
            result.reject(self._stub(task, prefilter=matched), "classifier", "no verdict: no valid classifier answer")
            return
        cls = verdict.model_dump()
        if not verdict.is_tutorial:
            result.reject(self._stub(task, prefilter=matched, classifier=cls), "classifier",
                          f"not a tutorial: {verdict.reason}")
            return
        if verdict.site == NO_SITE:
            result.reject(self._stub(task, prefilter=matched, classifier=cls), "classifier",
                          f"site not served: {verdict.reason}")
            return
        site = self.sites[verdict.site]
        spec = await self.model_for("spec writer").structured(
            [{"role": "system", "content": SPEC_SYSTEM.format(
                site=site.name, description=site.description,
                start=SPEC_START_MINIWOB if site.miniwob else SPEC_START_PAGES,
                tools="\n".join(f"- {t.name}: {t.description}" for t in self.tools))},
             {"role": "user", "content": SPEC_USER.format(title=title, text=text)}], TaskSpecification)
        if spec is None:
            result.reject(self._stub(task, prefilter=matched, classifier=cls), "spec", "no spec: no valid spec answer")
            return
        params, problem = start_page(site, spec.start_url)
        found = {"prefilter": matched, "classifier": cls, "spec": {"site": site.name, **spec.model_dump()}}
        if params is None:
            result.reject(self._stub(task, **found), "spec", f"no start page: {problem}")
            return
        found["spec"]["start"] = params
        guidance = GUIDANCE.format(
            site=site.name, goal=spec.goal, prerequisites="\n".join(f"- {p}" for p in spec.prerequisites) or "- none",
            steps="\n".join(f"{i}. {s}" for i, s in enumerate(spec.steps, 1)), expected_outcome=spec.expected_outcome)
        for k in range(self.config.replays):
            env_task = Task(id=task.id, env=self.config.env, instruction=spec.goal, params=params,
                            seed=self.config.seed + k, goal={"type": "miniwob"} if site.miniwob else {},
                            metadata={"source": SOURCE, "tutorial": task.id, "site": site.name})
            try:
                async with self.make_env() as env:
                    # Replay k is the agent's draw k (its own sampling seed, so no cached answer is repeated):
                    # nothing in its prompt says which replay it is.
                    episode = await play_episode(
                        env, self.policy(draw=k), env_task, max_steps=self.config.max_steps,
                        max_parse_failures=self.config.max_parse_failures, guidance=guidance,
                        evaluate=bool(env_task.goal))  # only tasks with a check of their own are evaluated
            except Exception as exc:  # noqa: BLE001 - classified and quarantined; the other replays go on
                stage, error = episode_failure(exc)
                result.fail(task.id, stage, error, {"tutorial": task.id, "replay": k})
                continue
            episode.count(result.counts)
            await self._judge_and_keep(task, k, env_task, spec, episode, found, result)

    async def _judge(self, task: Task, spec: TaskSpecification, steps: list[Step], result: TaskResult) -> Any:
        page = next((s for s in reversed(steps) if isinstance(s, WebObservation)), None)
        # What the world showed: the actions and the pages, not the agent's thoughts (unless judge.self_report).
        seen, _ = judged_steps(steps, self.config.judge.self_report)
        log = numbered_path(seen, self.config.max_step_page_chars) or "(no step)"
        prompt = JUDGE_USER.format(
            instruction=task.instruction, expected_outcome=spec.expected_outcome or "(not stated)",
            log=cut_head(log, self.config.max_log_chars), answer=final_answer(steps) or "(none)",
            page=describe_page(page, self.config.max_page_chars) if page is not None else "(no page)")
        shots = screenshots(steps, self.config.max_judge_images)
        return await self.images.ask(self.judge_llm, JUDGE_SYSTEM, prompt, shots, JudgeVerdict, result.counts)

    def _goal_alone(self, steps: list[Step]) -> tuple[list[Step], str, list[dict[str, Any]]]:
        """The replay with the agent's own system prompt (no tutorial) as its first step, the prompt it replayed
        with, and the declared rewrite: the trained agent will act from the goal alone, so its rows must not be
        conditioned on the tutorial's steps."""
        replayed = steps[0].content if steps and is_system_step(steps[0]) else ""
        out = [self.policy().system_step(None), *(steps[1:] if replayed else steps)]
        actions = [i for i, s in enumerate(out) if s.kind in ("api", "code", "message")]
        rewrite = Rewrite(steps=actions, kind="context",
                          reason="the agent chose these actions with the tutorial's steps in its system prompt "
                                 "(details.replay_prompt); the record's system prompt is the goal's alone, as "
                                 "the trained agent will act") if actions else None
        return out, replayed, [rewrite.model_dump()] if rewrite is not None else []

    def _unquoted(self, steps: list[Step], hidden: list[str]) -> tuple[list[Step], list[int], tuple[int, str] | None]:
        """AgentTrek trains the agent on the task, not the tutorial: the steps with each thought that quotes the
        tutorial (`filters.grounding.quoted`: what the goal-only context before it does not hold) removed (or, with
        `tutorial_quotes: drop`, left for the caller to drop), the indices stripped, and the first step the record
        must be dropped for (a message that quotes it, or any quote under `drop`) with what it quoted."""
        out: list[Step] = []
        stripped: list[int] = []
        drop_for: tuple[int, str] | None = None
        for i, step in enumerate(steps):
            if step.kind in ("api", "code", "message") and drop_for is None:
                seen = visible_text(out, self.tools)
                thought = "\n".join(x for x in (step.thought, step.reasoning) if x)
                said = quoted(step.content, hidden, seen) if step.kind == "message" else []
                in_thought = quoted(thought, hidden, seen) if thought else []
                if said or (in_thought and self.config.tutorial_quotes == "drop"):
                    drop_for = (i, (said or in_thought)[0])
                elif in_thought:
                    step = step.model_copy(update={"thought": None, "reasoning": None})
                    stripped.append(i)
            out.append(step)
        return out, stripped, drop_for

    async def _judge_and_keep(self, tutorial: TaskSpec, k: int, task: Task, spec: TaskSpecification, episode: Episode,
                              found: dict[str, Any], result: TaskResult) -> None:
        verdict = await self._judge(task, spec, episode.steps, result)
        env_eval = episode.evaluation  # None: the task has no check of its own
        details = {"tutorial": {"id": tutorial.id, "title": tutorial.payload["title"]}, **found, "replay": k,
                   **episode.details()}
        steps = episode.steps
        quoting = None
        if self.config.train_prompt == "goal":
            steps, details["replay_prompt"], details["rewrites"] = self._goal_alone(steps)
            hidden = [tutorial.payload["text"], details["replay_prompt"]]
            steps, stripped, quoting = self._unquoted(steps, hidden)
            if stripped:
                result.counts["tutorial_quotes_stripped"] += len(stripped)
                details["tutorial_quotes"] = {"stripped": stripped}
                details["rewrites"] = [{**r, "steps": [i for i in r["steps"] if i not in stripped]}
                                       for r in details["rewrites"]] + [Rewrite(
                    steps=stripped, kind="written", reason="the agent's thought quoted the tutorial it replayed with "
                                                           "and was removed; the action is its own").model_dump()]
        details["train_prompt"] = self.config.train_prompt
        if verdict is None:
            trajectory = self.trajectory(task, f"#{k}", steps, env_eval, judge=None, **details)
            result.reject(trajectory, "judge", f"no verdict: the judge gave no valid answer "
                                               f"in {self.judge_llm.config.structured_attempts} attempts")
            return
        judged = Evaluation.of(1.0 if verdict.success else 0.0, f"judge: {verdict.reason}")
        use_env = env_eval is not None and self.config.success_from == "env"
        judge = {"reason": verdict.reason, "success": verdict.success, "model": self.judge_name,
                 "reads": SELF_REPORT if self.config.judge.self_report else WORLD}
        if env_eval is not None:
            judge["agrees_with_env"] = verdict.success == env_eval.success
            result.counts["judge_agrees_with_env" if judge["agrees_with_env"] else "judge_disagrees_with_env"] += 1
        trajectory = self.trajectory(task, f"#{k}", steps, env_eval if use_env else judged, judge=judge,
                                     success_source="env" if use_env else "judge", **details)
        if env_eval is not None and not use_env:
            trajectory.details["env_evaluation"] = env_eval.as_dict()
        result.counts[f"replay_{'success' if trajectory.success else 'failure'}"] += 1
        if quoting is not None:
            result.counts["filtered:tutorial_quote"] += 1
            result.reject(trajectory, "tutorial_quote", f"step {quoting[0]} quotes the tutorial the agent replayed "
                                                        f"with: {quoting[1]!r}")
            return
        if not trajectory.success and not self.config.keep_failed:
            why = verdict.reason if not use_env else f"{env_eval.reason} (judge: {verdict.reason})"  # type: ignore[union-attr]
            result.reject(trajectory, "outcome", f"unsuccessful: {why}")
            return
        result.trajectories.append(trajectory)
