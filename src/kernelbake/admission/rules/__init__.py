"""What admission denies, and why: the checks that turn verified images into an answer."""
