"""Capacity planning: replicas needed for a traffic mix, from measured device-seconds per request.

The load a class puts on the fleet is its arrival rate times the device-seconds one of its requests
costs: L_c = rate_c * d_c (busy devices). A replica is one device (one `lookahead serve` process, or
one Ray Serve replica, on the hardware the bench measured); at target utilisation u it can carry u
busy device-seconds per second, so the fleet needs ceil(sum_c L_c / u) replicas.

d_c comes from a bench summary (summary.json of `lookahead bench`): per class and strategy,
device_s_per_request, measured one request at a time. "Without the policy" every class runs
autoregressive; "with" each class runs the strategy the policy gives it (the bench's recommended
policy, or another file). Under continuous batching a request costs less device time (the pass is
shared); `batch_load` levels (benchmarks/batch_load.py) give that ratio at a concurrency, measured on
the same model: d(mode, N) / d(mode, 1), batched-ar for classes that run autoregressive, batched (the
allocator) for classes that speculate. The ratio is measured over a mix of classes and applied to
every class alike: an approximation.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lookahead.bench.config import parse_csv
from lookahead.errors import ConfigError

BASELINE = "autoregressive"


@dataclass(frozen=True)
class ClassPlan:
    request_class: str
    rate_per_s: float
    strategy: str  # what the policy runs for this class
    device_s_baseline: float  # per request, autoregressive
    device_s_policy: float  # per request, under the policy

    @property
    def load_baseline(self) -> float:
        return self.rate_per_s * self.device_s_baseline

    @property
    def load_policy(self) -> float:
        return self.rate_per_s * self.device_s_policy


@dataclass(frozen=True)
class CapacityPlan:
    classes: tuple[ClassPlan, ...]
    utilisation: float
    batching: tuple[float, float]  # device-s factors (baseline, policy) from batch-load levels; 1: none
    concurrency: int | None

    @property
    def load_baseline(self) -> float:
        return sum(c.load_baseline for c in self.classes)

    @property
    def load_policy(self) -> float:
        return sum(c.load_policy for c in self.classes)

    def replicas(self, load: float) -> int:
        return max(1, math.ceil(load / self.utilisation - 1e-9))

    def to_dict(self) -> dict[str, Any]:
        return {
            "utilisation": self.utilisation, "concurrency": self.concurrency,
            "batching_factor": {"baseline": self.batching[0], "policy": self.batching[1]},
            "load_baseline": round(self.load_baseline, 4), "load_policy": round(self.load_policy, 4),
            "replicas_baseline": self.replicas(self.load_baseline), "replicas_policy": self.replicas(self.load_policy),
            "classes": [{"class": c.request_class, "rate_per_s": c.rate_per_s, "strategy": c.strategy,
                         "device_s_baseline": round(c.device_s_baseline, 4),
                         "device_s_policy": round(c.device_s_policy, 4)} for c in self.classes],
        }


def parse_rates(text: str) -> dict[str, float]:
    """'chat=2,code=0.5' -> requests per second by class."""
    rates: dict[str, float] = {}
    for item in parse_csv(text, "--mix"):
        name, sep, value = item.partition("=")
        try:
            rate = float(value) if sep and name.strip() else -1.0
        except ValueError:
            rate = -1.0
        if not math.isfinite(rate) or rate < 0:
            raise ConfigError(f"--mix items look like CLASS=REQUESTS_PER_SECOND (>= 0), got {item!r}")
        rates[name.strip()] = rate
    if not any(rates.values()):
        raise ConfigError("--mix gives no traffic; give at least one class a rate > 0")
    return rates


def batching_factors(levels: list[dict[str, Any]], concurrency: int) -> tuple[float, float]:
    """(baseline, policy) device-seconds ratios at `concurrency` vs one request, from batch_load levels."""
    def device_s(mode: str, n: int) -> float:
        values = [lv["device_s_per_request"] for lv in levels if lv["mode"] == mode and lv["concurrency"] == n]
        if not values:
            have = sorted({lv["concurrency"] for lv in levels if lv["mode"] == mode})
            raise ConfigError(f"the batch-load results have no {mode} level at concurrency {n} (they have {have})")
        return float(statistics.median(values))

    return (device_s("batched-ar", concurrency) / device_s("batched-ar", 1),
            device_s("batched", concurrency) / device_s("batched", 1))


def plan(summary: dict[str, Any], rates: dict[str, float], *, utilisation: float = 0.7,
         policy: dict[str, Any] | None = None, batching: tuple[float, float] = (1.0, 1.0),
         concurrency: int | None = None) -> CapacityPlan:
    """The plan for `rates` (class -> requests/s) from a bench summary; `policy` (a policy file's dict)
    replaces the summary's recommended one."""
    if not 0 < utilisation <= 1:
        raise ConfigError(f"--utilisation must be in (0, 1], got {utilisation}")
    measured = summary.get("classes", {})
    missing = [c for c in rates if c not in measured]
    if missing:
        raise ConfigError(f"the bench summary has no measurements for {', '.join(missing)} "
                          f"(it has: {', '.join(sorted(measured))})")
    chosen = policy or summary.get("policy") or {}
    rows = []
    for cls, rate in rates.items():
        strategies = measured[cls]["strategies"]
        strategy = _strategy_of(chosen, cls)
        if strategy not in strategies or BASELINE not in strategies:
            raise ConfigError(f"class {cls}: the summary has no {strategy if BASELINE in strategies else BASELINE} "
                              f"measurements (it has {', '.join(strategies)}); bench that strategy too")
        factor = batching[0] if strategy == BASELINE else batching[1]  # batched AR, or batched speculation
        rows.append(ClassPlan(cls, rate, strategy,
                              strategies[BASELINE]["device_s_per_request"] * batching[0],
                              strategies[strategy]["device_s_per_request"] * factor))
    return CapacityPlan(tuple(rows), utilisation, batching, concurrency)


def _strategy_of(policy: dict[str, Any], cls: str) -> str:
    entry = (policy.get("classes") or {}).get(cls) or policy.get("default") or {"strategy": BASELINE}
    return str(entry.get("strategy", BASELINE))


def render(p: CapacityPlan) -> str:
    """A markdown table and the totals."""
    lines = ["| class | req/s | policy strategy | device-s/req AR | device-s/req policy | load AR | load policy |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for c in p.classes:
        lines.append(f"| {c.request_class} | {c.rate_per_s:g} | {c.strategy} | {c.device_s_baseline:.3f} | "
                     f"{c.device_s_policy:.3f} | {c.load_baseline:.2f} | {c.load_policy:.2f} |")
    lines.append(f"| **total** | {sum(c.rate_per_s for c in p.classes):g} | | | | "
                 f"**{p.load_baseline:.2f}** | **{p.load_policy:.2f}** |")
    where = (f"batched at concurrency {p.concurrency} per replica (device-s x {p.batching[0]:.2f} AR, "
             f"x {p.batching[1]:.2f} policy)" if p.concurrency else "one request at a time per replica")
    saved = 1 - p.load_policy / p.load_baseline if p.load_baseline > 0 else 0.0
    lines += ["", f"Replicas at {p.utilisation:.0%} utilisation, {where}: "
                  f"{p.replicas(p.load_baseline)} without the policy (autoregressive everywhere), "
                  f"{p.replicas(p.load_policy)} with it ({saved:.0%} less device time)."]
    return "\n".join(lines)


def load_json(path: str, what: str) -> Any:
    file = Path(path)
    if file.is_dir():
        file = file / {"summary": "summary.json", "batch-load": "levels.json", "policy": "policy.json"}[what]
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the {what} file {file}: {exc}") from None
