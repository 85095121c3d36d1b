"""What the model reads back for a tool call: one JSON shape for success and every refusal."""

from __future__ import annotations

from typing import Any


def ok(result: Any, *, edited_arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    output: dict[str, Any] = {"ok": True, "result": result}
    if edited_arguments is not None:
        output["edited_by_human"] = True
        output["executed_arguments"] = edited_arguments
        output["message"] = "A human edited the arguments before the call ran; it ran with executed_arguments."
    return output


def error(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error_code": code, "message": message}


def rejected(tool: str, note: str) -> dict[str, Any]:
    # Rejection is information, not an error: the model reads the note and adapts.
    return error("APPROVAL_REJECTED", f"A human rejected '{tool}': {note.strip() or 'no reason given'}")


def expired(tool: str, note: str) -> dict[str, Any]:
    return error("APPROVAL_EXPIRED", f"No human decided on '{tool}' in time ({note}); it did not run.")


def declined(tool: str, approval_status: str, note: str) -> dict[str, Any]:
    """Return what the model reads for a call a person rejected or let expire."""
    return expired(tool, note) if approval_status == "expired" else rejected(tool, note)


def pending(tool: str, approval_id: str) -> dict[str, Any]:
    return {
        "ok": True,
        "status": "APPROVAL_PENDING",
        "approval_id": approval_id,
        "message": f"'{tool}' is queued for human approval; it will run once, after approval.",
    }


def in_doubt(tool: str) -> dict[str, Any]:
    return error(
        "IN_DOUBT",
        f"'{tool}' was started but its worker stopped before recording a result; it may or may not "
        "have taken effect and will not be run again. A person should check.",
    )
