"""What a command shows its user, apart from its data: stderr diagnostics (log), a terminal's
progress line (progress), the one `Error:` line and its exit code (errors), the bounds of every
numeric option (optlimits), and paths as a reader can open them (paths)."""
