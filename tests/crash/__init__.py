"""Real-process crash tests: SIGKILLed children and coordinators, stale holders."""
