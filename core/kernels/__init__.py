"""OpenCL kernels, one ``.cl`` file per op (forward and backward), each with a launcher module.

Launcher convention (after llm.c): arguments are outputs, inputs, weights, then sizes; backward
launchers *add* into gradient buffers; work-group sizes come from the device's limits and may be
overridden with ``local_size=`` (tests run several sizes).
"""
