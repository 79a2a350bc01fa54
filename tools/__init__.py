"""Scripts that write parts of the repository from the code (the site's reference pages, the architecture diagram)."""
