"""The render node agent: settings, GPU inventory and telemetry, register/heartbeat/commands, local runner."""
