"""Autoscaling: scaling plans, the pure scaling policy, the scaler loop, host providers, the simulator."""
