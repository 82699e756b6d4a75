"""Converters: public agent-dataset records -> interlingua, and interlingua -> training formats."""
