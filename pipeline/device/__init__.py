"""The run side: what loads and runs a built artifact with TVM's runtime library alone (no
compiler), and the one command a lent GPU machine runs (`job`)."""
