"""Tool specs shared by the SWE-agent / OpenHands style converters."""

from __future__ import annotations

from converters._util import py_tool

BASH = py_tool("bash", "Run a bash command in the terminal.", {"command": "string"})
SUBMIT = py_tool("submit", "Finish the task and submit the current changes.")
STR_REPLACE_EDITOR = {
    "name": "str_replace_editor",
    "description": "View, create and edit files: view, create, str_replace, insert, undo_edit.",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
            "path": {"type": "string", "description": "Absolute path to a file or directory."},
            "file_text": {"type": "string", "description": "Content of the file to create (create)."},
            "old_str": {"type": "string", "description": "Exact text to replace (str_replace)."},
            "new_str": {"type": "string", "description": "Replacement / inserted text (str_replace, insert)."},
            "insert_line": {"type": "integer", "description": "Insert after this line (insert)."},
            "view_range": {"type": "array", "items": {"type": "integer"}, "description": "[start, end] lines (view)."},
        },
        "required": ["command", "path"],
    },
}
