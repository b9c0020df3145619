"""Late binding as a request is served, stage by stage (docs/serving.md, "Late binding")."""

import contextlib
import time

from compass_router.state import LateError
from compass_rules.admission import LATE_MESSAGE
from compass_rules.binding import allowed_at, bind_stage, pipeline_view
from compass_rules.deadlines import follower_left_ms
from compass_rules.followers import (
    joint_options,
    joint_spare_ms,
    lag_spare_ms,
    polled_followers_left_ms,
    slacks_behind_ms,
)
from compass_rules.routing import config_key


class LazyConfig(dict):
    """A request's configuration, each stage (and those before it) bound at its first read: a dict
    holding every name from the start (json writes ``{}`` for an empty one without asking)."""

    def __init__(
        self,
        table,
        deadline_ns,
        inflight,
        qps=0.0,
        hurried=False,
        followers=0,
        servers=1,
        gated=False,
        static_start_ns=None,
    ):
        super().__init__(dict.fromkeys(table["stage_of"]))
        self.table = table
        self.deadline_ns = deadline_ns
        self.inflight = inflight
        self.bound = {}
        self.target = None
        self.next_stage = 0
        # The stage reached (the next component it calls): binding counts the stages ahead.
        self.at = 0
        # The last stage it called (-1: none) and its time (ms) in each stage's calls so far.
        self.called = -1
        self.spent = [0.0] * len(table["stages"])
        # The slow loop: what the pod's rate allows now (None: no configuration has a limit).
        limited = any(entry[4] is not None for entry in table["configs"])
        self.allowed = allowed_at(table["max_qps"], qps) if limited else None
        # It waited long for an instance (the table's degrade_after): the fastest completion.
        self.hurried = hurried
        # The requests waiting behind it (PendingPoller), shared by ``servers`` instances.
        self.followers, self.servers = followers, servers
        # Behind the gate its waiters are seen with their deadlines, read at each stage bound.
        self.gated = gated
        # The lag cap (the table's lag_share): when static fastest would start it.
        self.static_start_ns = static_start_ns

    def _bind_through(self, stage):
        while self.next_stage <= stage:
            left_ms = (self.deadline_ns - time.time_ns()) / 1e6
            # Behind a gate of several slots the running pipelines share the pod.
            running = self.inflight.pipelines_running() if self.gated else 1
            table, backlog = pipeline_view(
                self.table, running, self.inflight.backlog_ms(len(self.table["stages"]))
            )
            at = min(self.at, self.next_stage)
            if self.gated:
                now = time.time_ns()
                behind = [
                    follower_left_ms(deadline, queued, now, table["slo_ms"])
                    for deadline, queued in self.inflight.gate_followers()
                ]
            else:
                behind = polled_followers_left_ms(self.followers, left_ms)
            # Each configuration's remaining time, read once for the rules below.
            known = {}
            lag = lag_spare_ms(
                table, self.bound, at, backlog, time.time_ns(), self.static_start_ns, known
            )
            slacks = slacks_behind_ms(table, self.bound, at, backlog, behind, self.servers, known)
            spare = min((s for s in slacks if s is not None), default=float("inf"))
            if spare < float("inf"):
                # Slack the followers can use better is not all spent here (joint_spare_ms);
                # where only its quickest fits the spare, the plan cannot change what it binds.
                own, theirs = joint_options(
                    table, self.bound, at, left_ms, backlog, self.allowed, known
                )
                extra = own[:, 0]
                if ((extra > 0) & (extra <= min(spare, lag))).any():
                    spare = min(spare, joint_spare_ms(own, theirs, slacks, self.servers, lag))
            # It waited long (the table's degrade_after): no more than its fastest completion.
            spare = 0.0 if self.hurried else min(spare, lag)
            self.target, _, likely = bind_stage(
                table,
                self.next_stage,
                self.bound,
                left_ms,
                backlog,
                self.allowed,
                at,
                spare,
                # The table's refusal, at the first stage only (later, the request is under way).
                table["refuse"] and self.next_stage == 0,
                known=known,
            )
            if self.target is None:
                raise LateError(
                    f"{LATE_MESSAGE}: {max(left_ms, 0.0):.0f} ms of its deadline left, the "
                    f"fastest completion needs {likely:.0f} ms; retry later"
                )
            chosen = table["configs"][self.target][0]
            for name in table["stages"][self.next_stage]:
                self.bound[name] = chosen[name]
                dict.__setitem__(self, name, chosen[name])
            self.next_stage += 1

    def __getitem__(self, name):
        stage = self.table["stage_of"].get(name)
        if stage is None:
            raise KeyError(name)
        if name not in self.bound:
            if self.called >= 0:
                # Read after a call: the pipeline is done with the stage it called last.
                self.at = max(self.at, min(stage, self.called + 1))
            self._bind_through(stage)
        return self.bound[name]

    def get(self, name, default=None):
        return self[name] if name in self.table["stage_of"] else default

    def __iter__(self):
        # Overridden, so that dict(config) and {**config} read through __getitem__ (and bind).
        return iter(self.table["stage_of"])

    def items(self):
        self._bind_through(len(self.table["stages"]) - 1)
        return [(name, self.bound[name]) for name in self.table["stage_of"]]

    def values(self):
        return [value for _, value in self.items()]

    def __setitem__(self, name, value):
        raise TypeError("a request's configuration is read-only")

    def reach(self, stage):
        """The request now calls ``stage``'s component."""
        self.at = max(self.at, stage)
        self.called = max(self.called, stage)

    def stage_ms(self, stage):
        """The predicted time at ``stage`` of the configuration the request heads for."""
        return 0.0 if self.target is None else self.table["configs"][self.target][2][stage]

    def stage_left_ms(self, stage):
        """What is left of that time after the request's calls at ``stage`` so far."""
        return max(self.stage_ms(stage) - self.spent[stage], 0.0)

    def spend(self, stage, ms):
        """A call at ``stage`` took ``ms``."""
        self.spent[stage] += ms

    def key(self):
        """The canonical key of the configuration served (binding what was never read)."""
        return config_key(dict(self.items()))


def staged(run_call, config, inflight):
    """``run_call`` that puts a bound request at a stage's in-flight slot for each call."""
    stage_of_model = config.table["stage_of_model"]

    def staged_call(model, inputs, outputs):
        stage = stage_of_model.get(model)
        if stage is None:
            return run_call(model, inputs, outputs)
        config.reach(stage)
        # A stage that calls several times counts its earlier calls' time as done.
        inflight.enter(stage, config.stage_left_ms(stage))
        started = time.monotonic_ns()
        try:
            return run_call(model, inputs, outputs)
        finally:
            inflight.leave()
            config.spend(stage, (time.monotonic_ns() - started) / 1e6)

    return staged_call


@contextlib.contextmanager
def whole_stage(config, inflight):
    """A table of one stage and no component: bound at take-up, in flight for the whole run."""
    if not config.table["whole"]:
        yield
        return
    config.items()
    config.reach(0)
    inflight.enter(0, config.stage_ms(0))
    try:
        yield
    finally:
        inflight.leave()
