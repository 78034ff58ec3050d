"""What a study answers: the configuration it writes (``choice``) and the YAML file for ``vllm
serve --config`` (``emit``)."""
