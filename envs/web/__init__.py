"""A small web shop as a state machine: pages as element lists (axtree), browser-style actions."""
