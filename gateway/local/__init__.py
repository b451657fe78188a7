"""Launchers for the embedded defaults: local backends started as child processes."""
