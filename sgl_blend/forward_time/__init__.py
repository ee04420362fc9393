"""The time one forward of a given shape takes on a device.

Shared by the simulator and the emulated GPU, so both price an iteration with the same model and
neither imports the other for it.
"""
