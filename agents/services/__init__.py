"""Every state change of the engine; views, tasks and the CLI call these, never the models."""

from __future__ import annotations

from agents.services.approvals import (
    Attempt,
    Decision,
    approval_decide,
    approval_expire,
    approval_expire_due,
    approval_refuse,
)
from agents.services.audit import audit_append, audit_verify
from agents.services.deadlines import (
    approval_deadline_fire,
    approval_deadlines_due,
    approval_extend,
    approval_remind_due,
    toolcall_run_now,
)
from agents.services.effects import sideeffect_record
from agents.services.errors import (
    AlreadyDecided,
    DigestMismatch,
    InvalidInput,
    LeaseLost,
    NotFound,
    NotPermitted,
    ServiceError,
    Unavailable,
    WrongState,
)
from agents.services.grants import Remember, grant_create, grant_match, grant_revoke, grant_use, parse_duration
from agents.services.runs import (
    run_cancel,
    run_complete,
    run_create,
    run_fail,
    run_lease,
    run_renew_lease,
    run_request_resume,
    run_suspend,
)
from agents.services.saved_agents import savedagent_save
from agents.services.steps import (
    PlannedCall,
    message_append,
    step_open,
    toolcall_ask,
    toolcall_claim,
    toolcall_finish,
    toolcall_hold,
    toolcall_mark_in_doubt,
    toolcall_record_result,
    toolcall_schedule,
)
from agents.services.tokens import token_authenticate, token_create, token_revoke
from agents.services.users import role_groups_ensure, user_create, user_set_groups, user_set_password

__all__ = [
    "AlreadyDecided",
    "Attempt",
    "Decision",
    "DigestMismatch",
    "InvalidInput",
    "LeaseLost",
    "NotFound",
    "NotPermitted",
    "PlannedCall",
    "Remember",
    "ServiceError",
    "Unavailable",
    "WrongState",
    "approval_deadline_fire",
    "approval_deadlines_due",
    "approval_decide",
    "approval_expire",
    "approval_expire_due",
    "approval_extend",
    "approval_refuse",
    "approval_remind_due",
    "audit_append",
    "audit_verify",
    "grant_create",
    "grant_match",
    "grant_revoke",
    "grant_use",
    "message_append",
    "parse_duration",
    "role_groups_ensure",
    "run_cancel",
    "run_complete",
    "run_create",
    "run_fail",
    "run_lease",
    "run_renew_lease",
    "run_request_resume",
    "run_suspend",
    "savedagent_save",
    "sideeffect_record",
    "step_open",
    "token_authenticate",
    "token_create",
    "token_revoke",
    "toolcall_ask",
    "toolcall_claim",
    "toolcall_finish",
    "toolcall_hold",
    "toolcall_mark_in_doubt",
    "toolcall_record_result",
    "toolcall_run_now",
    "toolcall_schedule",
    "user_create",
    "user_set_groups",
    "user_set_password",
]
