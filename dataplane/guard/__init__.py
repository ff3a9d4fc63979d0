"""Guardrail hooks: safety classifiers the proxy calls on the prompt and on the answer (:mod:`.hooks`)."""
