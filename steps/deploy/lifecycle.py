"""The model lifecycle: which version the staging and the production endpoint should serve, and getting them there.

One piece of code for AWS and this machine: the deploy Lambda (handler.py, with `sagemaker_account.py`) and the
local backend (pipeline/local/account.py) each hand `Lifecycle` an `Account` (the registry, the two endpoints, the
runtime client, the alerts). Standard library only.

The registry is the truth. Besides its approval status, each version carries in its metadata:
  staging_test=pass|fail (and staging_test_<number>, see endpoint_check.metadata)   its endpoint test
  promoted_at=<UTC time>                   promoted to production (promote N, auto-promotion, a rollback)
  staging_retest_at=<UTC time>             deploy N asked for a new test: due while later than staging_test_at
  staging_deployed_at, production_deployed_at=<UTC time>   when it was last sent to that endpoint
Decisions (the pure functions below) read the Approved versions and the version each endpoint serves or is moving to:
  staging     the newest Approved version while it has no test result; else the version it serves while that is
              Approved; else (that version was rejected) the rollback target.
  production  the Approved version promoted last (promotion needs a passed staging test); if the version it serves is
              no longer Approved: the rollback target, which is marked promoted once production serves it (or
              is being updated to it). A promotion is recorded unless its deploy fails (while production is busy
              it follows the update in flight); a failed deploy records <stage>_deploy_failed_at and
              <stage>_deploy_failure instead.
  rollback    the newest other Approved version that passed its staging test (and was not held by the challenge,
              unless promoted by hand); if there is none the endpoint is left as it is and an alert says so.
  challenge   a version that passed its staging test is compared with the version production serves on the same
              rows (challenge.py): challenge=pass|hold|due in its metadata; auto_promote promotes it only on a pass;
              a hold is an alert and waits for a person (promote N); `due` (production was busy) is compared when
              production is InService again.
An endpoint being created or updated is left alone (`deferred`): the end of that update reconciles again (on AWS the
"SageMaker Endpoint State Change" rule invokes the Lambda; locally nothing is ever busy). A deploy that did not stick
(the endpoint serves a version sent there before ours: a blue/green auto-rollback or a failed update) is not retried
until the version is promoted or deployed again by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from steps.contract import APPROVED
from steps.deploy import challenge, endpoint_check
from steps.deploy.targets import P95_MS

STAGING, PRODUCTION = "staging", "production"
STAGES = (STAGING, PRODUCTION)
PASS, FAIL = "pass", "fail"
TEST, PROMOTED = endpoint_check.PREFIX, "promoted_at"
RETEST = "staging_retest_at"  # deploy N asked for a new staging test of a version tested before
BUSY = ("Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting")
ALERTS = ("test", "held", "promotion", "rollback", "no-rollback", "deploy-failed")  # outcome actions that are alerts
CHALLENGE_ACTIONS = {challenge.PASS: "challenge-passed", challenge.HOLD: "held", challenge.DUE: "challenge-due"}


class Refused(ValueError):
    """A lifecycle request that cannot be done (promote an untested version, deploy a rejected one): one line."""


class DeployError(RuntimeError):
    """An endpoint could not be created or updated; the message says why and what to do."""


def deployed_key(stage: str) -> str:
    return f"{stage}_deployed_at"


def utc_now() -> str:
    """A sortable UTC time in the registry's alphabet."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Version:
    """One model package version as the lifecycle sees it."""

    number: int
    status: str
    metadata: dict[str, str] = field(default_factory=dict)
    arn: str = ""

    @property
    def test(self) -> str | None:
        return self.metadata.get(TEST) or None

    @property
    def test_due(self) -> bool:
        """No staging test yet, or one asked for (deploy N) after the last."""
        return self.test is None or self.metadata.get(RETEST, "") > self.metadata.get(f"{TEST}_at", "")

    @property
    def passed(self) -> bool:
        return self.status == APPROVED and self.test == PASS


@dataclass(frozen=True)
class Endpoint:
    """A stage's endpoint: the version it serves or is being created / updated to, and its status ("" when absent)."""

    name: str
    version: int | None = None
    status: str = ""
    instances: int | None = None
    where: str = ""  # the local URL, or the endpoint config on SageMaker

    @property
    def busy(self) -> bool:
        return self.status in BUSY


@dataclass(frozen=True)
class Policy:
    """The lifecycle's settings (config: deploy.auto_promote and deploy.test)."""

    auto_promote: bool = False
    test_rows: int = 200
    max_accuracy_drop: float = 0.02
    p95_ms: float = P95_MS["cpu"]  # the config sets its target's (steps/deploy/targets.py)
    p50_factor: float = 5.0
    p50_overhead_ms: float = 20.0
    challenge_metric: str = "accuracy"  # the gate's metric (evaluation.gate_metric): accuracy or macro_f1
    challenge_rows: int = 4000  # rows of the candidate's sample that production is sent
    challenge_tolerance: float = 0.01  # promoted when its interval's lower end is above minus this


@dataclass(frozen=True)
class Decision:
    version: Version | None  # what the endpoint should serve; None: leave it as it is
    reason: str
    rollback: bool = False  # the endpoint serves a version that is no longer Approved


class Account(Protocol):
    """What the lifecycle acts on: the registry, the staging and production endpoints, the alerts."""

    def approved(self) -> list[Version]: ...

    def version(self, number: int) -> Version | None: ...

    def set_metadata(self, version: Version, values: dict[str, str]) -> None: ...

    def endpoint(self, stage: str) -> Endpoint: ...

    def deploy(self, stage: str, version: Version) -> dict[str, Any]:
        """Create or update the stage's endpoint to serve `version`: {"action": created | updated | unchanged |
        in-progress, "endpoint_config_name", ...}; raises DeployError."""

    def in_service(self, stage: str) -> str:
        """What to do once the stage serves its target (production: autoscaling); a line, "" for nothing."""

    def runtime(self, stage: str) -> Any:
        """A `sagemaker-runtime` client for the stage's endpoint."""

    def sample(self, version: Version) -> list[dict[str, Any]]:
        """The labelled rows of the version's evaluation (endpoint_check.read_sample); SampleError if missing."""

    def expected(self, version: Version) -> dict[str, Any]:
        """What its endpoint must show (endpoint_check.expectation of its environment and evaluation report)."""

    def test_seconds(self) -> float | None:
        """How long the endpoint test may send rows (None: no limit): the verdict must be written in the time left."""

    def alert(self, line: str, detail: dict[str, Any]) -> None: ...


def rollback_target(approved: list[Version], exclude: int | None) -> Version | None:
    """The newest Approved version other than `exclude` that passed its staging test and was not held as worse than
    production (unless a person promoted it)."""
    return max((v for v in approved if v.passed and v.number != exclude and (
        v.metadata.get(challenge.PREFIX) != challenge.HOLD or v.metadata.get(PROMOTED))),
        key=lambda v: v.number, default=None)


def _rollback(approved: list[Version], endpoint: Endpoint) -> Decision:
    target = rollback_target(approved, endpoint.version)
    if target is None:
        return Decision(None, f"version {endpoint.version} is no longer Approved and no other Approved version passed "
                              f"its staging test: {endpoint.name} keeps serving it", rollback=True)
    return Decision(target, f"version {endpoint.version} is no longer Approved: back to version {target.number}, the "
                            f"newest other Approved version that passed its staging test", rollback=True)


def staging_decision(approved: list[Version], endpoint: Endpoint) -> Decision:
    """What staging should serve (see the module)."""
    candidate = max(approved, key=lambda v: v.number, default=None)
    if candidate is not None and candidate.test is None:
        return Decision(candidate, f"version {candidate.number} is the newest Approved version and has no staging test")
    served = next((v for v in approved if v.number == endpoint.version), None)
    if served is not None:
        return Decision(served, f"version {served.number} is Approved")
    if endpoint.version is None:
        target = rollback_target(approved, None)
        reason = "the newest Approved version that passed its staging test" if target else "no Approved version"
        return Decision(target, reason)
    return _rollback(approved, endpoint)


def production_decision(approved: list[Version], endpoint: Endpoint) -> Decision:
    """What production should serve (see the module)."""
    served = next((v for v in approved if v.number == endpoint.version), None)
    if endpoint.version is not None and served is None:
        return _rollback(approved, endpoint)
    promoted = [v for v in approved if v.passed and v.metadata.get(PROMOTED)]
    if promoted:
        last = max(promoted, key=lambda v: (v.metadata[PROMOTED], v.number))
        return Decision(last, f"version {last.number} was promoted last")
    if served is not None:
        return Decision(served, f"version {served.number} is Approved")
    return Decision(None, "no version has been promoted yet (trainium-pipeline promote N)")


class Lifecycle:
    """Reconciles the two stages of one account with the registry; every method returns its outcomes, one dict
    {"stage", "endpoint", "action", "version", "line", ...} per thing done or decided, alerts included."""

    def __init__(self, account: Account, policy: Policy, now: Callable[[], str] = utc_now) -> None:
        self.account, self.policy, self.now = account, policy, now

    def _outcome(self, stage: str, endpoint: str, action: str, version: int | None, line: str,
                 **extra: Any) -> dict[str, Any]:
        outcome = {"stage": stage, "endpoint": endpoint, "action": action, "version": version, "line": line, **extra}
        if action in ALERTS:
            self.account.alert(line, outcome)
        return outcome

    def reconcile(self, stage: str, chosen: Version | None = None, why: str = "asked for by hand") -> list[dict]:
        """Bring `stage` to its decided version (or to `chosen`, for the reason `why`: no did-not-stick check)."""
        endpoint = self.account.endpoint(stage)
        decision = Decision(chosen, f"version {chosen.number} {why}") if chosen else (
            staging_decision if stage == STAGING else production_decision)(self.account.approved(), endpoint)
        target, name = decision.version, endpoint.name
        if target is None:
            action = "no-rollback" if decision.rollback else "none"
            return [self._outcome(stage, name, action, endpoint.version, f"{stage} {name}: {decision.reason}")]
        outcomes = []
        if decision.rollback:
            outcomes.append(self._outcome(stage, name, "rollback", target.number, f"{stage} {name}: {decision.reason}",
                                          rejected=endpoint.version))
        if endpoint.version == target.number:
            if endpoint.busy:
                return [*outcomes, self._outcome(stage, name, "in-progress", target.number,
                                                 f"{stage} {name}: version {target.number} is on its way "
                                                 f"({endpoint.status})")]
            return [*outcomes, *self._serving(stage, endpoint, target)]
        if endpoint.busy:
            return [*outcomes, self._outcome(stage, name, "deferred", target.number,
                                             f"{stage} {name} is {endpoint.status} (to version {endpoint.version}): "
                                             f"version {target.number} follows when it is InService")]
        if chosen is None and not decision.rollback and self._did_not_stick(stage, target, endpoint):
            line = (f"{stage} {name}: version {target.number} was sent there after version {endpoint.version}, yet "
                    f"{endpoint.version} serves (rolled back or failed); not retried: promote or deploy it again")
            return [*outcomes, self._outcome(stage, name, "deploy-failed", target.number, line)]
        return [*outcomes, *self._deploy(stage, name, target, decision.reason,
                                         promote=decision.rollback and stage == PRODUCTION)]

    def _did_not_stick(self, stage: str, target: Version, endpoint: Endpoint) -> bool:
        """Whether `target` was sent to the stage after the version it serves was, yet that one serves (both sends
        recorded: without a record nothing can be told)."""
        ours = target.metadata.get(deployed_key(stage))
        if not ours or endpoint.version is None or endpoint.status != "InService":
            return False
        served = self.account.version(endpoint.version)
        theirs = served.metadata.get(deployed_key(stage)) if served else None
        return bool(theirs) and ours > theirs

    def _deploy(self, stage: str, name: str, target: Version, reason: str,
                promote: bool = False) -> list[dict[str, Any]]:
        try:
            result = self.account.deploy(stage, target)
        except DeployError as e:
            self.account.set_metadata(target, {f"{stage}_deploy_failed_at": self.now(),
                                               f"{stage}_deploy_failure": endpoint_check.clean(e)})
            return [self._outcome(stage, name, "deploy-failed", target.number,
                                  f"{stage} {name}: deploying version {target.number} failed: {e}")]
        if result["action"] in ("created", "updated"):
            self.account.set_metadata(target, {deployed_key(stage): self.now()})
        where = result.get("url") or result.get("endpoint_config_name", "")
        outcomes = [self._outcome(stage, name, result["action"], target.number,
                                  f"{stage} {name}: version {target.number} {result['action']} ({where}): {reason}",
                                  endpoint_config_name=result.get("endpoint_config_name", ""), where=where)]
        endpoint = self.account.endpoint(stage)
        if promote and endpoint.version == target.number:  # a rollback target: recorded once it serves
            self.account.set_metadata(target, {PROMOTED: self.now()})
        if endpoint.version == target.number and endpoint.status == "InService":
            outcomes += self._serving(stage, endpoint, target, announce=False)
        return outcomes

    def _serving(self, stage: str, endpoint: Endpoint, target: Version, announce: bool = True) -> list[dict]:
        """The stage serves its target and is InService: test it (staging, once) or scale it (production)."""
        outcomes = []
        if announce:
            outcomes.append(self._outcome(stage, endpoint.name, "unchanged", target.number,
                                          f"{stage} {endpoint.name}: serves version {target.number}",
                                          where=endpoint.where))
        if stage == STAGING and target.test_due:
            return outcomes + self.test(target, endpoint)
        if stage == PRODUCTION:
            line = self.account.in_service(stage)
            if line:
                outcomes.append(self._outcome(stage, endpoint.name, "scaling", target.number, f"{stage} "
                                              f"{endpoint.name}: {line}"))
            due = [v for v in self.account.approved() if v.passed and v.number > target.number
                   and v.metadata.get(challenge.PREFIX) == challenge.DUE]
            if due:  # compared once production was no longer busy
                outcomes += self.challenge(max(due, key=lambda v: v.number))
        return outcomes

    def test(self, version: Version, endpoint: Endpoint) -> list[dict[str, Any]]:
        """The endpoint test of `version` on staging; the result goes into its metadata; auto-promotes on a pass."""
        try:
            rows = endpoint_check.pick(self.account.sample(version), self.policy.test_rows)
        except (endpoint_check.SampleError, OSError) as e:
            result = endpoint_check.failed(endpoint.name, f"no labelled sample: {e}")
        else:
            result = endpoint_check.run(self.account.runtime(STAGING), endpoint.name, rows,
                                        max_accuracy_drop=self.policy.max_accuracy_drop,
                                        p95_budget_ms=self.policy.p95_ms, expected=self.account.expected(version),
                                        p50_factor=self.policy.p50_factor,
                                        p50_overhead_ms=self.policy.p50_overhead_ms,
                                        time_budget_s=self.account.test_seconds())
        values = endpoint_check.metadata(result, self.now())
        self.account.set_metadata(version, values)
        line = f"staging test of version {version.number} on {endpoint.name}: {endpoint_check.summary(result)}"
        outcomes = [self._outcome(STAGING, endpoint.name, "test", version.number, line, test=result)]
        if result["passed"]:
            outcomes += self.challenge(Version(version.number, version.status, {**version.metadata, **values},
                                               version.arn))
        return outcomes

    def challenge(self, version: Version) -> list[dict[str, Any]]:
        """Compare a version that passed its staging test with production (steps/deploy/challenge.py), record the
        verdict in its metadata, and promote it when it passes and auto_promote is on (else it waits for a person)."""
        result = self._challenge(version)
        if result is None:  # nothing in production to beat (or it serves this version): promoted as it stands
            return self.promote(version, automatic=True) if self.policy.auto_promote else []
        values = challenge.metadata(result, self.now())
        self.account.set_metadata(version, values)
        name = self.account.endpoint(PRODUCTION).name
        outcomes = [self._outcome(PRODUCTION, name, CHALLENGE_ACTIONS[result["verdict"]], version.number,
                                  f"production {name}: version {version.number} {result['reason']}",
                                  challenge=result)]
        if result["verdict"] == challenge.PASS and self.policy.auto_promote:
            outcomes += self.promote(Version(version.number, version.status, {**version.metadata, **values},
                                             version.arn), automatic=True)
        return outcomes

    def _challenge(self, version: Version) -> dict[str, Any] | None:
        endpoint = self.account.endpoint(PRODUCTION)
        if endpoint.version is None or endpoint.version == version.number:
            return None
        if endpoint.busy:
            return challenge.verdict(challenge.DUE, f"is compared with production once {endpoint.name} is InService "
                                                    f"(it is {endpoint.status})", endpoint.version)
        champion = self.account.version(endpoint.version)
        ours, theirs = (v.metadata.get(challenge.DIGEST, "") if v else "" for v in (version, champion))
        if ours != theirs:
            return challenge.verdict(challenge.HOLD, f"has another label set than production version "
                                                     f"{endpoint.version} (label_digest {ours or '-'} against "
                                                     f"{theirs or '-'}): not compared, left for a person (promote N)",
                                     endpoint.version)
        try:
            rows = endpoint_check.pick(self.account.sample(version), self.policy.challenge_rows)
        except (endpoint_check.SampleError, OSError) as e:
            return challenge.verdict(challenge.HOLD, f"has no labelled sample to compare on ({e}): left for a "
                                                     f"person (promote N)", endpoint.version)
        staging = self.account.endpoint(STAGING)
        if staging.version != version.number or staging.busy:
            return challenge.verdict(challenge.HOLD, f"could not be compared: staging {staging.name} no longer serves "
                                                     f"it (deploy N compares it again)", endpoint.version)
        answers: dict[str, list[str]] = {}
        for stage in (STAGING, PRODUCTION):
            asked = rows[:len(answers[STAGING])] if answers else rows  # production: the rows staging answered
            name = self.account.endpoint(stage).name
            answers[stage], problem = challenge.ask(self.account.runtime(stage), name, asked,
                                                    self.account.test_seconds())
            if problem or not answers[stage]:
                why = problem or "out of time before its first answer"
                return challenge.verdict(challenge.HOLD, f"could not be compared: {stage} {name}: {why}; left for a "
                                                         f"person (promote N)", endpoint.version)
        return challenge.compare(rows, answers[STAGING], answers[PRODUCTION], self.policy.challenge_metric,
                                 self.policy.challenge_tolerance, endpoint.version)

    def _version(self, version: Version | int) -> Version:
        found = self.account.version(version) if isinstance(version, int) else version
        if found is None:
            raise Refused(f"model version {version} does not exist")
        return found

    def promote(self, version: Version | int, automatic: bool = False) -> list[dict[str, Any]]:
        """Send a version (or version number) to production; Refused unless it is Approved and passed its staging
        test."""
        version = self._version(version)
        if version.status != APPROVED:
            raise Refused(f"version {version.number} is {version.status}, not Approved: approve it first")
        if version.test != PASS:
            test = endpoint_check.from_metadata(version.metadata)
            why = f"it failed ({test.get('reason', 'no reason recorded')})" if version.test else "it has none yet"
            raise Refused(f"version {version.number} has not passed its staging test: {why}")
        promoted_at = self.now()
        promoted = Version(version.number, version.status, {**version.metadata, PROMOTED: promoted_at}, version.arn)
        deployed = self.reconcile(PRODUCTION, promoted, "was promoted")
        if any(o["action"] == "deploy-failed" for o in deployed):  # the registry keeps the version that serves
            return deployed
        self.account.set_metadata(version, {PROMOTED: promoted_at})  # serves, is on its way or follows an update
        endpoint = self.account.endpoint(PRODUCTION)
        how = "automatically after its staging test passed" if automatic else "by hand"
        return [self._outcome(PRODUCTION, endpoint.name, "promotion", version.number,
                              f"production {endpoint.name}: version {version.number} promoted {how}"), *deployed]

    def deploy(self, version: Version | int, stage: str = STAGING) -> list[dict[str, Any]]:
        """Send an Approved version (or version number) to a stage by hand (staging: tested again there)."""
        version = self._version(version)
        if version.status != APPROVED:
            raise Refused(f"version {version.number} is {version.status}, not Approved: approve it first")
        if stage == PRODUCTION:
            return self.promote(version)
        if version.test is not None:  # tested again when staging serves it, here or at its InService event
            self.account.set_metadata(version, {RETEST: self.now()})
        return self.reconcile(STAGING, Version(version.number, version.status,
                                               {k: v for k, v in version.metadata.items() if not k.startswith(TEST)},
                                               version.arn))

    def on_change(self) -> list[dict[str, Any]]:
        """After an approval status changed: production first (a rollback), then staging."""
        return self.reconcile(PRODUCTION) + self.reconcile(STAGING)

    def on_endpoint(self, stage: str, status: str, reason: str = "") -> list[dict[str, Any]]:
        """A stage's endpoint changed status (IN_SERVICE / FAILED as EventBridge spells it, or DescribeEndpoint)."""
        if status.replace("_", "").lower() == "failed":
            name = self.account.endpoint(stage).name
            line = f"{stage} {name} failed: {reason or 'no reason given'}"
            return [self._outcome(stage, name, "deploy-failed", None, line)]
        return self.reconcile(stage)
