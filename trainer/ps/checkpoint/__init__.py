"""Checkpoints of a parameter-server (or local) model: a directory of files that
load into any number of servers, or into a local model.

In: tables and dense parameters to save; a directory to load. Out: files written
under a temporary name and renamed into place (``directory``: meta.json, dense
``.pt`` files, the layout), sparse tables as Arrow IPC (``table_files``, also
``python -m trainer.ps.checkpoint.table_files DIR``), every file checked before
anything changes.
"""
