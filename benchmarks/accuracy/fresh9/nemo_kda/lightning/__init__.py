"""Lightning-side pieces: the trainer stand-in and the Megatron precision plugin."""
