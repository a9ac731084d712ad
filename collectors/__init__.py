"""What runs inside and around the user's job: launcher, bootstrap, step hooks, samplers."""
