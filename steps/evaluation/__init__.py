"""The Evaluate step (processing container): the model's quality, the endpoint's variant, the serving artifact."""
