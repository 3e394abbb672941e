"""The payload: what runs inside a stack (recipes, data, prompt, rewards, train, evaluate, fastgen)."""
