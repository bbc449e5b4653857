"""Speed figures of the harness and the bundled library (`make bench`; see SPEED.md).

Every figure is printed and recorded, never asserted: it depends on the machine and its load.
"""
