"""The lowest layer shared by the broker and the render node: typed settings loading and
process-group control.  It imports nothing of ours, so ``broker``, ``streamer``, ``bench`` and
``tests`` may all use it without an import pointing up."""
