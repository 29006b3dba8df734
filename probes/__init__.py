"""Evidence sources: everything here produces Facts and nothing else.

This package never imports ``diagnose``. Heavy modules (torch, pynvml) are imported inside
the functions that need them, so importing a probe module stays cheap.
"""
