"""Runnable processes: the operator API, the command line and the wiring between the packages."""
