"""eaglekit and vLLM: the plugin vLLM loads (`plugin`), the runner vLLM's python executes (`run`) and the live doctor
that drives it from eaglekit (`doctor`). Nothing is imported here: vLLM's processes import the plugin alone."""
