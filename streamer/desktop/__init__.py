"""What a session shows and takes: Xvfb display, capture, X input, input messages, the built-in game."""
