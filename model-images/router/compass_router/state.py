"""The router's state files, replaced atomically, reread when changed (docs/serving.md)."""

import contextlib
import json
import os
import tempfile
import time

from compass_rules.admission import DROP, FASTEST, LATE_MESSAGE, check_admission, dispatch_verdict
from compass_rules.protocol import router_file
from compass_rules.routing import WEIGHT_STEPS, SmoothWeighting, config_key, quantize_weight

# The files beside a router's routing state (state_path's ``part``).
ADMISSION_FILE, BINDING_FILE, TABLES_FILE = "admission.json", "binding.json", "tables"
GATE_FILE, INFLIGHT_FILE = "gate.json", "inflight.bin"


def state_path(router_model, part=None):
    """The state file (or ``part`` beside it) of this server's (our parent's) ``router_model``."""
    return router_file(router_model, os.getppid(), part)


def _stamp(path):
    """What tells a replaced file from the last one read (None: there is none)."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def blend_state(key, blend, weight):
    """The state for a configuration with an optional blend; checks and normalises the weight."""
    if blend is None or weight in (None, 0, 0.0):
        return {"config": key}
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight != weight:
        raise ValueError(f"weight {weight!r} is not a number: give a share in [0, 1], e.g. 0.25")
    if not 0 <= weight <= 1 or weight in (float("inf"), float("-inf")):
        raise ValueError(f"weight {weight!r} is outside [0, 1]: give a share, e.g. 0.25")
    # Down to the grid, never more blend than asked.
    share = quantize_weight(weight)
    if share == 0:
        return {"config": key}
    if share == 1:
        return {"config": config_key(blend)}
    return {"config": key, "blend": config_key(blend), "weight": share}


def write_state(path, state, exclusive=False):
    """Write the routing state atomically; ``exclusive``: only if there is none yet."""
    directory = os.path.dirname(path)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".compass-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(state, out)
        if exclusive:
            # Fails if the control model wrote first: then its switch stands.
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        else:
            os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _canonical_state(data):
    """A state file's routing state with its keys canonical; raises if it is none."""
    state = {"config": config_key(json.loads(data["config"]))}
    if data.get("blend"):
        state.update(blend=config_key(json.loads(data["blend"])), weight=float(data["weight"]))
    return state


def read_state(path):
    """The routing state in a state file (keys canonical); raises if absent or unreadable."""
    with open(path, encoding="utf-8") as handle:
        return _canonical_state(json.load(handle))


class ActiveConfig:
    """The routing as the state file says (the default until there is one), reread when changed."""

    def __init__(self, path, default_key):
        self.file = TableFile(path, _canonical_state)
        self.state = {"config": default_key}
        self.dealer = None

    def current(self):
        """Canonical key of the configuration that serves the next request."""
        state = self.file.current()
        if state is not None and state != self.state:
            self.state, self.dealer = state, None
        if not self.state.get("blend"):
            return self.state["config"]
        if self.dealer is None:
            blended = round(self.state["weight"] * WEIGHT_STEPS)
            self.dealer = SmoothWeighting(
                [(self.state["config"], WEIGHT_STEPS - blended), (self.state["blend"], blended)]
            )
        return self.dealer.pick()


class LateError(Exception):
    """A request that would miss its deadline whatever served it."""


class TableFile:
    """A table a switch sends, as its file says, checked by ``check``, reread when changed."""

    def __init__(self, path, check):
        self.path = path
        self.check = check
        self.table = None
        self.stamp = None

    def current(self):
        """The table, or None while there is none (that feature off)."""
        stamp = _stamp(self.path)
        if stamp is None:
            self.table, self.stamp = None, None
        elif stamp != self.stamp:
            try:
                with open(self.path, encoding="utf-8") as handle:
                    self.table = self.check(json.load(handle))
                self.stamp = stamp
            except (OSError, ValueError, KeyError, TypeError):
                pass  # mid-replace or damaged: keep the last good one, read again next time
        return self.table


class Admission(TableFile):
    """The admission table (check_admission) and the judgement of a request by it."""

    def __init__(self, path):
        super().__init__(path, check_admission)

    def judge(self, key, deadline_ns):
        """The configuration that serves a request with this deadline (ns) now, or LateError."""
        table = self.current()
        own = None if table is None else table["quantiles_ms"].get(key)
        if own is None:
            return key
        left_ms = (deadline_ns - time.time_ns()) / 1e6
        fastest = table["fastest"]
        fastest_ms = table["quantiles_ms"][fastest]
        verdict = dispatch_verdict(
            left_ms, own, fastest_ms, table["degrade_below_ms"], table["refuse"]
        )
        if verdict == DROP:
            raise LateError(
                f"{LATE_MESSAGE}: {max(left_ms, 0.0):.0f} ms of its deadline left, the fastest "
                f"configuration needs {fastest_ms:.0f} ms; retry later"
            )
        return fastest if verdict == FASTEST else key
