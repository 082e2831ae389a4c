"""The multi-process server (DESIGN.md §2): HTTP + TokenizerManager in the main process, a
scheduler process and a detokenizer process connected by ZeroMQ PUSH/PULL sockets.

Entry points: ``radixlm serve`` / ``python -m radixlm.launch_server`` (see :mod:`.launch`).
"""
