/*
Copyright 2026 The code-sandbox-operator Authors.

Licensed under the MIT License; see the LICENSE file.
*/

package dockerruntime

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("idleELF", Label("unit"), func() {
	DescribeTable("produces a valid static executable",
		func(goarch string, machine elf.Machine, syscallInsn []byte) {
			img, err := idleELF(goarch)
			Expect(err).NotTo(HaveOccurred())
			Expect(len(img)).To(BeNumerically("<", 4096), "a few hundred bytes")

			f, err := elf.NewFile(bytes.NewReader(img))
			Expect(err).NotTo(HaveOccurred())
			defer f.Close()
			Expect(f.Class).To(Equal(elf.ELFCLASS64))
			Expect(f.Data).To(Equal(elf.ELFDATA2LSB))
			Expect(f.Type).To(Equal(elf.ET_EXEC))
			Expect(f.Machine).To(Equal(machine))
			Expect(f.Version).To(Equal(elf.EV_CURRENT))
			Expect(f.OSABI).To(Equal(elf.ELFOSABI_NONE))

			Expect(f.Progs).To(HaveLen(1))
			p := f.Progs[0]
			Expect(p.Type).To(Equal(elf.PT_LOAD))
			Expect(p.Flags).To(Equal(elf.PF_R|elf.PF_X), "one read+execute, never writable, segment")
			Expect(p.Off).To(BeZero())
			Expect(p.Filesz).To(Equal(uint64(len(img))))
			Expect(p.Memsz).To(Equal(p.Filesz))
			Expect(p.Align).To(BeNumerically(">", 0))
			Expect(p.Vaddr%p.Align).To(Equal(p.Off%p.Align), "loadable alignment")
			Expect(p.Vaddr).To(BeNumerically(">=", 0x10000), "above mmap_min_addr")

			Expect(f.Entry).To(BeNumerically(">=", p.Vaddr))
			Expect(f.Entry).To(BeNumerically("<", p.Vaddr+p.Memsz), "entry inside the PT_LOAD segment")
			code := img[f.Entry-p.Vaddr:]
			Expect(code).NotTo(BeEmpty())
			Expect(code).To(ContainSubstring(string(syscallInsn)), "the code makes a system call")
			Expect(f.Sections).To(BeEmpty(), "no section headers")
		},
		Entry("amd64", "amd64", elf.EM_X86_64, []byte{0x0f, 0x05}),
		Entry("arm64", "arm64", elf.EM_AARCH64, binary.LittleEndian.AppendUint32(nil, 0xd4000001)),
	)

	It("loops back to its first instruction on amd64 (pause; jmp)", func() {
		img, err := idleELF("amd64")
		Expect(err).NotTo(HaveOccurred())
		f, err := elf.NewFile(bytes.NewReader(img))
		Expect(err).NotTo(HaveOccurred())
		code := img[f.Entry-f.Progs[0].Vaddr:]
		Expect(code).To(HaveLen(9))
		Expect(code[:5]).To(Equal([]byte{0xb8, 34, 0, 0, 0}), "mov eax, SYS_pause")
		Expect(code[7]).To(Equal(byte(0xeb)))
		Expect(int(int8(code[8]))+9).To(BeZero(), "jmp target is the entry")
	})

	It("uses ppoll and loops back on arm64", func() {
		img, err := idleELF("arm64")
		Expect(err).NotTo(HaveOccurred())
		f, err := elf.NewFile(bytes.NewReader(img))
		Expect(err).NotTo(HaveOccurred())
		code := img[f.Entry-f.Progs[0].Vaddr:]
		Expect(len(code) % 4).To(BeZero())
		n := len(code) / 4
		insn := func(i int) uint32 { return binary.LittleEndian.Uint32(code[4*i:]) }
		Expect(insn(n-2)).To(Equal(uint32(0xd4000001)), "svc #0")
		// movz x8, #73 (ppoll)
		Expect(insn(n - 3)).To(Equal(uint32(0xd2800000 | 73<<5 | 8)))
		last := insn(n - 1)
		Expect(last>>26).To(Equal(uint32(0b000101)), "unconditional branch")
		imm := int32(last<<6) >> 6 // sign-extend imm26
		Expect(int(imm)+(n-1)).To(BeZero(), "branch target is the entry")
	})

	DescribeTable("errors on an unsupported architecture",
		func(goarch string) {
			img, err := idleELF(goarch)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(`architecture "` + goarch + `"`))
			Expect(img).To(BeNil())
		},
		Entry("riscv64", "riscv64"),
		Entry("386", "386"),
		Entry("empty", ""),
	)

	It("names the tools volume after its content, the helper included", func() {
		name := toolsVolumeName()
		Expect(name).To(MatchRegexp(`^code-sandbox-tools-[0-9a-f]{12}$`))
		helper, err := helperBinary(runtime.GOARCH)
		Expect(err).NotTo(HaveOccurred(), "run `make helper` first")
		Expect(len(helper)).To(BeNumerically(">", 100<<10))
		_, err = helperBinary("riscv64")
		Expect(err).To(MatchError("the sandbox helper for linux/riscv64 is not embedded in this build; run `make helper`"))
		Expect(toolsVolumeName()).To(Equal(name))
		m := toolsMount()
		Expect(m.ReadOnly).To(BeTrue())
		Expect(m.Target).To(Equal(toolsMountPath))
		Expect(m.VolumeOptions).NotTo(BeNil())
		Expect(m.VolumeOptions.NoCopy).To(BeTrue())
	})

	It("runs natively: stays up, and SIGTERM ends it", func() {
		if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
			Skip("the idle process only runs on linux/amd64 and linux/arm64")
		}
		img, err := idleELF(runtime.GOARCH)
		Expect(err).NotTo(HaveOccurred())
		path := filepath.Join(GinkgoT().TempDir(), "idle")
		Expect(os.WriteFile(path, img, 0o755)).To(Succeed())
		cmd := exec.Command(path)
		if err := cmd.Start(); err != nil {
			Skip("cannot execute from the temp dir (noexec?): " + err.Error())
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		DeferCleanup(func() { _ = cmd.Process.Kill() })

		Consistently(done, 500*time.Millisecond, 50*time.Millisecond).ShouldNot(Receive(), "the idle process must not exit on its own")
		Expect(cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
		var waitErr error
		Eventually(done, 5*time.Second).Should(Receive(&waitErr))
		Expect(waitErr).To(HaveOccurred())
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		Expect(ok).To(BeTrue())
		Expect(ws.Signaled()).To(BeTrue(), "ended by a signal, status %v", ws)
		Expect(ws.Signal()).To(Equal(syscall.SIGTERM))
	})
})
