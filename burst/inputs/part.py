"""The run's inputs as a staged part (:class:`burst.staging.parts.Part`), and what the
training process and ``burst resume`` ask of them.

A training run declares its inputs and starts the recorder when its ``Run`` is made
(:func:`declare`); the freeze stages them with the code (:func:`stage_quietly`) unless the
run's background stager does (:func:`for_run`), and each persisted snapshot first writes
the manifest's draft (what the run read, by stat) and restages in the background when
the run has read something new (:func:`refresh`), so a snapshot a resume starts from
always comes with the list of its inputs, and what a node needs is in the store before
the GPU dies.
:class:`InputsPart` is the one object doing that work: ``pending`` says what the store
lacks without reading a file (a stat each: a changed file counts whole), ``stage``
hashes, uploads the missing chunks (within the throttle) and writes the manifest last, so
a manifest never names a chunk the store lacks. A node (``$BURST_INPUTS_MAP`` set) stages
nothing: its inputs are the placed copies of the run's, whose manifest stays as it is.

``burst resume`` calls :func:`for_resume`: an input that cannot be shipped stops it in one
line; chunks the run had not uploaded yet are uploaded from here, if the files are still
the ones the run read.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from burst.errors import ConfigError
from burst.inputs import chunks, names, recorder, selection
from burst.inputs.selection import Selection  # in the class body `selection` is a method
from burst.snapshot import priority
from burst.staging import spawn
from burst.staging.parts import Pending, Throttle
from burst.store.base import Store

Say = Callable[[str], None]
_PARTS: dict[tuple[str, str], InputsPart] = {}
_GUARD = threading.Lock()


def _stderr(line: str) -> None:
    print(f"burst: {line}", file=sys.stderr, flush=True)


class InputsPart:
    """A run's inputs: what the store lacks of them, and staging that."""

    name = "inputs"

    def __init__(self, run_id: str, declared: Iterable[str | os.PathLike[str]] = (), *,
                 settings: selection.Settings | None = None, record: bool | None = None,
                 environment: Iterable[str | os.PathLike[str]] = (), say: Say = _stderr,
                 code_dir: str | os.PathLike[str] | None = None) -> None:
        self.run_id = run_id
        self.settings = settings or selection.settings()
        self.declared = [os.fspath(p) for p in declared]
        self.record = self.settings.record if record is None else record
        self.environment = selection.environment_dirs(environment)
        self.code_dir = os.fspath(code_dir) if code_dir is not None else None
        self.code_root: str | None = None
        self.in_archive: set[str] | None = None
        self.managed = False  # True once a background stager stages it (burst.env.stager)
        self.say = say
        self._said: set[str] = set()
        self._staged: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) stored
        self._stored: dict[str, chunks.FileEntry] = {}  # hashed entries the store holds
        self._saved: bytes | None = None  # the manifest last written
        self._loaded = False
        self._lock = threading.Lock()
        self._since = 0  # the recorder's mark when this run began: it reads what came after
        self._recorded: set[str] = set()  # what the recorder gave this run so far
        if self.record:
            recorder.start()
            self._since = recorder.mark()

    def set_code(self, root: str, members: Iterable[str]) -> None:
        """The code archive's root and members: files read there travel with the code."""
        self.code_root, self.in_archive = os.path.realpath(root), set(members)

    def selection(self, store: Store | None = None) -> selection.Selection:
        if self.record and recorder.recording():
            self._recorded.update(recorder.collect(self._since))
        recorded = sorted(self._recorded)
        root = getattr(store, "root", None)  # a store on disk: what is read there is burst's
        if isinstance(root, str | os.PathLike) and os.fspath(root) not in self.environment:
            self.environment.append(os.fspath(root))
        if self.code_root is None and self.code_dir is not None:
            self.code_root, self.in_archive = _project(self.code_dir)
        ignored = _git_ignored(self.code_root, self.in_archive or set(), recorded)
        return selection.choose(self.settings, self.declared, recorded,
                                code_root=self.code_root, in_archive=self.in_archive,
                                ignored=ignored, environment=self.environment)

    # -- the Part protocol ------------------------------------------------------------

    def pending(self, store: Store) -> Pending:
        """Files not stored as they are now (stat only), and the manifest if unwritten."""
        self._load_staged(store)
        chosen = self.selection(store)
        waiting, size = 0, 0
        for path in (f for r in chosen.roots for f in r.files):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if self._staged.get(path) != (st.st_size, st.st_mtime_ns):
                waiting, size = waiting + 1, size + st.st_size
        unwritten = self._saved is None and bool(chosen.roots or chosen.refused)
        manifest = 1 if waiting or unwritten else 0
        detail = f"{waiting} input file(s), {size / 1e6:.1f} MB" if waiting else ""
        return Pending(self.name, waiting + manifest, size, detail)

    def draft(self, store: Store) -> chunks.Manifest:
        """Write what the run reads, known by stat (cheap: no file is read), unless the
        store holds that already: a run that dies before staging still names its inputs."""
        with self._lock:
            self._load_staged(store)
            chosen = self.selection(store)
            self._tell(selection.lines(chosen))
            entries = []
            for path in (f for r in chosen.roots for f in r.files):
                try:
                    stored = self._stored.get(path)
                    entries.append(stored if stored is not None and chunks.unchanged(stored)
                                   else chunks.known_entry(path))
                except OSError as exc:
                    chosen.refused.append({"path": path,
                                           "why": f"{names.UNREADABLE} ({exc.strerror})"})
            manifest = self._manifest(chosen, entries)
            self._save(store, manifest, bool(chosen.roots or chosen.refused))
            return manifest

    def stage(self, store: Store, throttle: Throttle | None = None,
              stop: threading.Event | None = None) -> chunks.Manifest | None:
        """Write the draft, upload what the store lacks, then the complete manifest;
        None if stopped before the end."""
        drafted = self.draft(store)
        with self._lock:
            entries = []
            for entry in drafted.files:
                try:
                    entries.append(entry if entry.hashed and chunks.unchanged(entry)
                                   else chunks.hash_file(entry.path))
                except OSError as exc:
                    drafted.refused.append({"path": entry.path,
                                            "why": f"{names.UNREADABLE} ({exc.strerror})"})
            known = chunks.stored_chunks(store)
            for entry in entries:
                if stop is not None and stop.is_set():
                    return None
                chunks.upload_file(store, entry, known, throttle.wait if throttle else None)
            manifest = chunks.Manifest(drafted.inputs, entries, drafted.skipped,
                                       drafted.refused, drafted.mirrors, drafted.home)
            self._save(store, manifest, bool(manifest.inputs or manifest.refused))
            self._staged = {e.path: (e.size, e.mtime_ns) for e in entries}
            self._stored = {e.path: e for e in entries}
            return manifest

    def _manifest(self, chosen: Selection, entries: list[chunks.FileEntry]
                  ) -> chunks.Manifest:
        return chunks.Manifest([r.to_json() for r in chosen.roots], entries, chosen.skipped,
                               chosen.refused, chosen.mirrors, str(Path.home()))

    def _save(self, store: Store, manifest: chunks.Manifest, worth: bool) -> None:
        """Write ``manifest`` if it says something new (nothing read outside the project
        and nothing written before: nothing to write)."""
        raw = manifest.to_bytes()
        if (worth or self._saved) and raw != self._saved:
            chunks.save(store, self.run_id, manifest)
            self._saved = raw

    @property
    def staged_once(self) -> bool:
        """A manifest was written (or found) for this run."""
        return self._saved is not None

    # -- helpers ------------------------------------------------------------------------

    def _load_staged(self, store: Store) -> None:
        """After a restart: what the stored manifest names, unchanged here, is staged."""
        if self._loaded:
            return
        self._loaded = True
        try:
            stored = chunks.load(store, self.run_id)
        except Exception:
            return
        if stored is not None:
            hashed = [e for e in stored.files if e.hashed and chunks.unchanged(e)]
            self._staged = {e.path: (e.size, e.mtime_ns) for e in hashed}
            self._stored = {e.path: e for e in hashed}
            self._saved = stored.to_bytes()

    def _tell(self, lines: list[str]) -> None:
        for line in lines:
            if line not in self._said:
                self._said.add(line)
                self.say(f"inputs: {line}")


def _git_ignored(root: str | None, in_archive: set[str], paths: Iterable[str]
                 ) -> dict[str, str]:
    """For files of the project the archive lacks: the git rule ignoring each."""
    if not root:
        return {}
    rels = [os.path.relpath(p, root) for p in paths if p.startswith(root + "/")]
    rels = [r for r in rels if r not in in_archive and not r.endswith(selection.CODE_SUFFIXES)]
    if not rels:
        return {}
    try:
        done = spawn.run(["git", "-C", root, "check-ignore", "-v", "--", *rels], timeout=30)
    except OSError:
        return {}
    out = {}
    for line in done.stdout.decode(errors="replace").splitlines():
        rule, _, path = line.partition("\t")
        source, _, pattern = rule.rpartition(":")
        out[path] = f"{pattern} in {source.rsplit(':', 1)[0]}"
    return out


def _project(code_dir: str) -> tuple[str, set[str]]:
    """The project's root and the files its code archive holds (git's view: tracked and
    untracked files git does not ignore), asked of git when no archive was handed over."""
    try:
        top = spawn.run(["git", "-C", code_dir, "rev-parse", "--show-toplevel"], timeout=30)
        root = top.stdout.decode().strip() if top.ok else ""
        if not root:
            return os.path.realpath(code_dir), set()
        listed = spawn.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], timeout=60)
    except OSError:
        return os.path.realpath(code_dir), set()
    return os.path.realpath(root), set(listed.stdout.decode(errors="replace").split("\0")) - {""}


def archive_members(tar_gz: bytes) -> list[str]:
    """The paths a code archive holds."""
    with tarfile.open(fileobj=io.BytesIO(tar_gz), mode="r:gz") as tar:
        return tar.getnames()


# -- the training process ------------------------------------------------------------------


def on_node(environ: Mapping[str, str] | None = None) -> bool:
    """This process runs on a node where burst placed the inputs."""
    return bool((os.environ if environ is None else environ).get(names.MAP_ENV))


def declare(store: Store, run_id: str, inputs: Iterable[str | os.PathLike[str]] = (),
            environment: Iterable[str | os.PathLike[str]] = (),
            code_dir: str | os.PathLike[str] | None = None) -> InputsPart | None:
    """The run's inputs part (made once per store and run; on a node: none)."""
    if on_node():
        return None
    with _GUARD:
        part = _PARTS.get((store.url, run_id))
        if part is None:
            part = _PARTS[(store.url, run_id)] = InputsPart(
                run_id, inputs, environment=environment, code_dir=code_dir)
        return part


def release(store: Store, run_id: str) -> None:
    """The run has closed: forget its part and stop recording for it. What it read is
    named in the store already (the final snapshot refreshed it); a later run in this
    process records afresh."""
    with _GUARD:
        part = _PARTS.pop((store.url, run_id), None)
    if part is not None and part.record:
        recorder.stop()


def for_run(run_id: str) -> list[InputsPart]:
    """The inputs part of ``run_id`` for a background stager (a factory of
    :mod:`burst.env.stageparts`): from then on the stager stages it, throttled, and the
    freeze and :func:`refresh` leave it alone."""
    with _GUARD:
        found = [p for (_, run), p in _PARTS.items() if run == run_id]
    for part in found:
        part.managed = True
    return found


def registered(store: Store, run_id: str) -> InputsPart | None:
    """The part :func:`declare` made for this run, if any (the background stager's)."""
    with _GUARD:
        return _PARTS.get((store.url, run_id))


def stage_quietly(store: Store, run_id: str, code_root: str | None = None,
                  tar_gz: bytes | None = None) -> str | None:
    """Stage the run's inputs now (the freeze's upload thread); the problem, if any."""
    part = registered(store, run_id)
    if part is None or part.managed:
        return None
    try:
        if code_root and tar_gz:
            part.set_code(code_root, archive_members(tar_gz))
        part.stage(store)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


_REFRESHING: set[tuple[str, str]] = set()


def refresh(store: Store, run_id: str) -> None:
    """At a persisted snapshot, in a thread: make sure the store names what the run
    has read (the draft: a stat per file, a small write when it changed), then stage the
    rest (unless the run's stager does). A run that dies before its inputs are uploaded
    thus still names them for ``burst resume``."""
    part = registered(store, run_id)
    key = (store.url, run_id)
    if part is None:
        return
    with _GUARD:
        if key in _REFRESHING:
            return
        _REFRESHING.add(key)

    def work() -> None:  # never in the training thread: a slow store must not stall it
        try:
            part.draft(store)
            if not part.managed and not part.pending(store).ready:
                part.stage(store)
        except Exception as exc:
            part.say(f"inputs: could not stage: {exc}")
        finally:
            with _GUARD:
                _REFRESHING.discard(key)

    priority.start_idle(work, name="burst-inputs")  # the step keeps its cores


def reset() -> None:
    """Forget every run's part (tests)."""
    with _GUARD:
        _PARTS.clear()
    recorder.stop()
    recorder.reset()
    chunks.reset_cache()


# -- burst resume -----------------------------------------------------------------------------


def for_resume(store: Store, run_id: str, *, dry_run: bool = False, say: Say = print
               ) -> tuple[list[str], dict[str, str]]:
    """Check the run's inputs before a launch: ``(warnings, hub mirror variables)``.

    An input the run could not ship is refused here, in one line. Chunks not stored yet
    (the run died before it staged them) are uploaded now when the files here are still
    the ones the run read; otherwise the resume is refused: the node would miss them."""
    manifest = chunks.load(store, run_id)
    if manifest is None:
        return [], {}
    if manifest.refused:
        first = manifest.refused[0]
        more = f" (and {len(manifest.refused) - 1} more)" if len(manifest.refused) > 1 else ""
        raise ConfigError(f"input {first['path']} cannot be shipped to a node: "
                          f"{first['why']}{more}; exclude it ([inputs] exclude) or make it "
                          "shippable, then run again")
    known = chunks.stored_chunks(store)
    missing = manifest.missing(known)
    changed = [e for e in missing if not chunks.unchanged(e)]
    if changed:
        raise ConfigError(f"input {changed[0].path} is not in the store yet and changed (or "
                          "is gone) since the run read it: the node could not get it")
    if missing and dry_run:
        return [f"{len(missing)} input file(s) not in the store yet: a resume uploads them"], \
            manifest.mirrors
    if missing:
        done = {e.path: e if e.hashed else chunks.hash_file(e.path) for e in missing}
        sent = sum(chunks.upload_file(store, e, known) for e in done.values())
        manifest.files = [done.get(e.path, e) for e in manifest.files]
        chunks.save(store, run_id, manifest)
        say(f"uploaded {len(missing)} input file(s) the run had not staged ({sent / 1e6:.1f} MB)")
    return [], manifest.mirrors
