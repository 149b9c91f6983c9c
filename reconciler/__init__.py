"""reconciler: resolves calls whose effect is unknown or wrong (probe, retry, compensate, ask).

The recovery decisions are pure and exported here; ``reconciler.service`` carries them out.
"""

from reconciler._policy import (
    Action,
    AskCompensationApproval,
    CallCase,
    Compensate,
    HandOver,
    Probe,
    ProbeAnswer,
    RecoveryPolicy,
    Resolution,
    ResolveApplied,
    ResolveNotApplied,
    Retry,
    decide_probe,
    decide_refused,
    decide_resolution,
    decide_transient,
    decide_unknown,
    decide_wrong_effect,
)

__all__ = [
    "Action",
    "AskCompensationApproval",
    "CallCase",
    "Compensate",
    "HandOver",
    "Probe",
    "ProbeAnswer",
    "RecoveryPolicy",
    "Resolution",
    "ResolveApplied",
    "ResolveNotApplied",
    "Retry",
    "decide_probe",
    "decide_refused",
    "decide_resolution",
    "decide_transient",
    "decide_unknown",
    "decide_wrong_effect",
]
