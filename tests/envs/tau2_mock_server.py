"""tau2-bench's mock domain over MCP (stdio), for the tests: the agent's tools and the user's (`user_`-prefixed)
over one world, one state per `state_key` (tau2's src/tau2/domains/mock/tools.py and user_tools.py, same
behaviour; the data are tau2's own, tests/envs/tau2_mock/PROVENANCE.md)."""

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

DATA = Path(__file__).with_name("tau2_mock")
BASE = {"agent": json.loads((DATA / "db.json").read_text()), "user": json.loads((DATA / "user_db.json").read_text())}
server = MCPServer("tau2-mock", log_level="WARNING")
_STATES: dict[str, dict[str, Any]] = {}


def _state(state_key: str) -> dict[str, Any]:
    if state_key not in _STATES:
        _STATES[state_key] = copy.deepcopy(BASE)
    return _STATES[state_key]


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    """tau2's update_data: nested mappings merged, everything else replaced."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


# ---- the agent's tools ----

@server.tool()
def create_task(user_id: str, title: str, description: str | None = None, state_key: str = "default") -> dict[str, Any]:
    """Create a new task for a user."""
    db = _state(state_key)["agent"]
    if user_id not in db["users"]:
        raise ValueError(f"User {user_id} not found")
    task_id = f"task_{len(db['tasks']) + 1}"
    db["tasks"][task_id] = task = {"task_id": task_id, "title": title, "description": description, "status": "pending"}
    db["users"][user_id]["tasks"].append(task_id)
    return task


@server.tool()
def get_users(state_key: str = "default") -> list[dict[str, Any]]:
    """Get all users in the database."""
    return list(_state(state_key)["agent"]["users"].values())


@server.tool()
def update_task_status(task_id: str, status: str, state_key: str = "default") -> dict[str, Any]:
    """Update the status of a task (pending or completed)."""
    db = _state(state_key)["agent"]
    if task_id not in db["tasks"]:
        raise ValueError(f"Task {task_id} not found")
    db["tasks"][task_id]["status"] = status
    return db["tasks"][task_id]


@server.tool()
def transfer_to_human_agents(summary: str, state_key: str = "default") -> str:
    """Transfer the user to a human agent, with a summary of the user's issue."""
    return "Transfer successful"


@server.tool()
def assert_number_of_tasks(user_id: str, expected_number: int, state_key: str = "default") -> bool:
    db = _state(state_key)["agent"]
    return len(db["users"][user_id]["tasks"]) == expected_number


@server.tool()
def assert_task_status(task_id: str, expected_status: str, state_key: str = "default") -> bool:
    db = _state(state_key)["agent"]
    if task_id not in db["tasks"]:
        raise ValueError(f"Task {task_id} not found")
    return db["tasks"][task_id]["status"] == expected_status


# ---- the user's tools ----

@server.tool()
def user_check_notifications(state_key: str = "default") -> list[dict[str, Any]]:
    """Check all notifications in the user's inbox."""
    return list(_state(state_key)["user"]["notifications"].values())


@server.tool()
def user_dismiss_notification(notification_id: str, state_key: str = "default") -> str:
    """Dismiss (mark as read) a notification."""
    notes = _state(state_key)["user"]["notifications"]
    if notification_id not in notes:
        raise ValueError(f"Notification {notification_id} not found")
    notes[notification_id]["status"] = "read"
    return f"Notification {notification_id} dismissed"


@server.tool()
def user_add_notification(notification_id: str, message: str, task_id: str | None = None,
                          state_key: str = "default") -> dict[str, Any]:
    note = {"notification_id": notification_id, "message": message, "status": "unread", "task_id": task_id}
    _state(state_key)["user"]["notifications"][notification_id] = note
    return note


@server.tool()
def user_assert_notification_status(notification_id: str, expected_status: str, state_key: str = "default") -> bool:
    notes = _state(state_key)["user"]["notifications"]
    if notification_id not in notes:
        raise ValueError(f"Notification {notification_id} not found")
    return notes[notification_id]["status"] == expected_status


# ---- control ----

@server.tool()
def initialize(agent_data: dict[str, Any] | None = None, user_data: dict[str, Any] | None = None,
               state_key: str = "default") -> str:
    """tau2's initialization_data: merged into the agent's and the user's worlds."""
    state = _state(state_key)
    _merge(state["agent"], agent_data or {})
    _merge(state["user"], user_data or {})
    return "ok"


@server.tool()
def digest(state_key: str = "default") -> str:
    """A hash of both worlds (the DB check)."""
    return hashlib.sha256(json.dumps(_state(state_key), sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    server.run()
