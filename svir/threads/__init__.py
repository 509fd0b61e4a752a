"""Threads: conversations svir keeps, continued by the model on request (/v1/threads)."""
