"""Node agent, the simulated LLM replica and its engine model."""
