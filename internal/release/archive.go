/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package release

import (
	"archive/tar"
	"archive/zip"
	"compress/flate"
	"compress/gzip"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// Entry is a file of an archive.
type Entry struct {
	Name string
	Mode os.FileMode
	Data []byte
}

// WriteArchive writes entries, sorted by name, all with mtime epoch, owner
// 0:0 and no user or group names, as a tar.gz (a zip for windows): the
// same entries and epoch give the same bytes with the same Go release.
func WriteArchive(w io.Writer, goos string, epoch int64, entries []Entry) error {
	entries = slices.Clone(entries)
	slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	mtime := time.Unix(epoch, 0).UTC()
	if goos == "windows" {
		return writeZip(w, mtime, entries)
	}
	return writeTarGz(w, mtime, entries)
}

func writeTarGz(w io.Writer, mtime time.Time, entries []Entry) error {
	gz, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	// No name and no time in the gzip header; OS "unknown".
	gz.ModTime, gz.OS = time.Time{}, 255
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.Name, Mode: int64(e.Mode.Perm()), Size: int64(len(e.Data)), ModTime: mtime, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(e.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

func writeZip(w io.Writer, mtime time.Time, entries []Entry) error {
	zw := zip.NewWriter(w)
	zw.RegisterCompressor(zip.Deflate, func(out io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(out, flate.BestCompression)
	})
	for _, e := range entries {
		hdr := &zip.FileHeader{Name: e.Name, Method: zip.Deflate, Modified: mtime}
		hdr.SetMode(e.Mode.Perm())
		fw, err := zw.CreateHeader(hdr)
		if err != nil {
			return err
		}
		if _, err := fw.Write(e.Data); err != nil {
			return err
		}
	}
	return zw.Close()
}
