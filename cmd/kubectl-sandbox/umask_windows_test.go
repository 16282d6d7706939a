package main

// withUmask reports that Windows has no umask.
func withUmask(int) bool { return false }
