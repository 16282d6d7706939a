package dockerruntime

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/mount"
)

// A sandbox must stay up even when its image has no shell and no sleep, so
// the manager supplies its own idle process; and every command and file
// transfer goes through the manager's helper (see HelperPath). The root
// filesystem is read-only and Docker cannot copy into a container's tmpfs, so
// both binaries live in a small named volume that every sandbox mounts
// read-only.
const (
	toolsMountPath = "/.code-sandbox"
	// IdleProcessPath is the sandbox's entrypoint when spec.command is empty.
	IdleProcessPath = toolsMountPath + "/idle"
)

// idleELF is a minimal static ELF executable that waits for signals forever.
// It is a few hundred bytes of machine code, so it runs in any image on the
// node's architecture (including FROM scratch) and costs no memory to speak
// of. Under Docker's init (tini) a SIGTERM ends it through the default
// disposition.
func idleELF(goarch string) ([]byte, error) {
	var machine uint16
	var code []byte
	switch goarch {
	case "amd64":
		machine = 0x3e
		code = []byte{
			0xb8, 0x22, 0x00, 0x00, 0x00, // mov eax, 34 (pause)
			0x0f, 0x05, // syscall
			0xeb, 0xf7, // jmp back to mov
		}
	case "arm64":
		machine = 0xb7
		// ppoll(NULL, 0, NULL, NULL) blocks until a signal arrives; arm64
		// has no pause(2).
		for _, insn := range []uint32{
			0xd2800000, // mov x0, #0
			0xd2800001, // mov x1, #0
			0xd2800002, // mov x2, #0
			0xd2800003, // mov x3, #0
			0xd2800928, // mov x8, #73 (ppoll)
			0xd4000001, // svc #0
			0x17fffffa, // b back to the first mov
		} {
			code = binary.LittleEndian.AppendUint32(code, insn)
		}
	default:
		return nil, fmt.Errorf("no idle process for architecture %q", goarch)
	}

	const (
		base       = 0x400000
		headerSize = 64
		phSize     = 56
	)
	total := uint64(headerSize + phSize + len(code))
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	_ = binary.Write(&b, le, uint16(2))                      // ET_EXEC
	_ = binary.Write(&b, le, machine)                        // e_machine
	_ = binary.Write(&b, le, uint32(1))                      // e_version
	_ = binary.Write(&b, le, uint64(base+headerSize+phSize)) // e_entry
	_ = binary.Write(&b, le, uint64(headerSize))             // e_phoff
	_ = binary.Write(&b, le, uint64(0))                      // e_shoff
	_ = binary.Write(&b, le, uint32(0))                      // e_flags
	_ = binary.Write(&b, le, uint16(headerSize))             // e_ehsize
	_ = binary.Write(&b, le, uint16(phSize))                 // e_phentsize
	_ = binary.Write(&b, le, uint16(1))                      // e_phnum
	_ = binary.Write(&b, le, uint16(0))                      // e_shentsize
	_ = binary.Write(&b, le, uint16(0))                      // e_shnum
	_ = binary.Write(&b, le, uint16(0))                      // e_shstrndx
	_ = binary.Write(&b, le, uint32(1))                      // PT_LOAD
	_ = binary.Write(&b, le, uint32(5))                      // PF_R|PF_X
	_ = binary.Write(&b, le, uint64(0))                      // p_offset
	_ = binary.Write(&b, le, uint64(base))                   // p_vaddr
	_ = binary.Write(&b, le, uint64(base))                   // p_paddr
	_ = binary.Write(&b, le, total)                          // p_filesz
	_ = binary.Write(&b, le, total)                          // p_memsz
	_ = binary.Write(&b, le, uint64(0x1000))                 // p_align
	b.Write(code)
	return b.Bytes(), nil
}

// toolsVolumeName names the volume after its content (the idle process and
// the helper), so a manager upgrade that changes the tools uses a fresh
// volume instead of rewriting files that running sandboxes execute.
func toolsVolumeName() string {
	if _, err := idleELF(runtime.GOARCH); err != nil {
		return "code-sandbox-tools-unsupported"
	}
	return "code-sandbox-tools-" + toolsContentHash(runtime.GOARCH)
}

func toolsMount() mount.Mount {
	return mount.Mount{
		Type:          mount.TypeVolume,
		Source:        toolsVolumeName(),
		Target:        toolsMountPath,
		ReadOnly:      true,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true},
	}
}

// The tools volume is filled through a never-started container, because
// Docker only copies into volumes through one. That container is created
// from a trusted image the manager makes itself, never from a tenant's
// image (whose content and configuration are the tenant's): an empty
// FROM-scratch root filesystem, imported offline and tagged after its
// content, so it is built once per daemon. The tag only finds it again: it
// is verified by content and used by ID (see ensureFillerImage).
const (
	// ToolsFillerRepository is the repository of the filler image.
	ToolsFillerRepository = "code-sandbox-operator/tools-filler"
	// fillerEntrypoint does not exist; the filler container never starts,
	// but Docker needs a command to create it.
	fillerEntrypoint = "/nonexistent"
)

// fillerImportChanges configure the filler image (Dockerfile instructions
// applied by the import).
var fillerImportChanges = []string{`CMD ["` + fillerEntrypoint + `"]`}

// fillerRootfs is the filler image's root filesystem as a tar: only the
// tools volume's mount point, with fixed metadata so the content (and the
// tag) are the same on every node.
func fillerRootfs() []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{
		Name: strings.TrimPrefix(toolsMountPath, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755,
		ModTime: time.Unix(0, 0), Format: tar.FormatPAX,
	})
	_ = tw.Close()
	return buf.Bytes()
}

// fillerDiffID is the digest of the filler's one layer: Docker names an
// uncompressed layer by the sha256 of its tar, so it is known before the
// import.
func fillerDiffID() string {
	return fmt.Sprintf("sha256:%x", sha256.Sum256(fillerRootfs()))
}

// fillerImageOK reports whether img is the filler image: exactly the
// filler's one layer and the configuration the import gives it, nothing a
// pulled image could add (entrypoint, environment, user, volumes, onbuild
// triggers, labels, health check).
func fillerImageOK(img image.InspectResponse) bool {
	cfg := img.Config
	return len(img.RootFS.Layers) == 1 && img.RootFS.Layers[0] == fillerDiffID() &&
		cfg != nil && slices.Equal(cfg.Cmd, []string{fillerEntrypoint}) &&
		len(cfg.Entrypoint) == 0 && len(cfg.Env) == 0 && cfg.User == "" && cfg.WorkingDir == "" &&
		len(cfg.Volumes) == 0 && len(cfg.OnBuild) == 0 && len(cfg.Labels) == 0 && cfg.Healthcheck == nil &&
		len(cfg.Shell) == 0 && len(cfg.ExposedPorts) == 0 && cfg.StopSignal == ""
}

// ToolsFillerImage is the filler image's reference, tagged after its
// content.
func ToolsFillerImage() string {
	h := sha256.New()
	h.Write(fillerRootfs())
	for _, c := range fillerImportChanges {
		h.Write([]byte(c + "\n"))
	}
	return ToolsFillerRepository + ":" + hex.EncodeToString(h.Sum(nil)[:6])
}
