"""LIBERO adapter: all five suites headless, official init states, language instructions."""
