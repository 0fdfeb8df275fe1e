"""Measuring whether an ensemble beats its members: tasks with their data shipped offline, a
sandbox for generated code, and scoring. (`ensemble-llm eval` builds on these.)"""
