"""What runs on the node itself: the stdlib bootstrap the task embeds (it installs burst
before burst exists there), and the restart bound the node counts in the store. Launchers
render these into the task they start, so this package sits below them; nothing here
launches anything."""
