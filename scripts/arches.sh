# The architectures the wheels are built for, and each one's names (sourced by scripts/wheel.sh,
# scripts/wheel-roots.sh and scripts/test.d/70-wheels.sh). ARCH is Python's machine name, the one wheel platform
# tags use (x86_64, aarch64, s390x, ppc64le); DEB is Debian's name of it (amd64, arm64, s390x, ppc64el).
#   arch_debian ARCH   Debian's name
#   arch_of DEB        the machine name of a Debian architecture
#   arch_triplet ARCH  the multiarch triplet: Python's SOABI and Debian's include and library directories
#   arch_qemu DEB      the qemu-user program that runs it on this x86_64 machine (nothing for amd64)
#   arch_loader DEB    glibc's dynamic loader there
arch_debian() { case $1 in x86_64) echo amd64 ;; aarch64) echo arm64 ;; ppc64le) echo ppc64el ;; *) echo "$1" ;; esac; }
arch_of() { case $1 in amd64) echo x86_64 ;; arm64) echo aarch64 ;; ppc64el) echo ppc64le ;; *) echo "$1" ;; esac; }
arch_triplet() { case $1 in ppc64le) echo powerpc64le-linux-gnu ;; *) echo "$1-linux-gnu" ;; esac; }
arch_qemu() { case $1 in amd64) ;; *) echo "qemu-$(arch_of "$1")-static" ;; esac; }
arch_loader() {
  case $1 in
    amd64) echo /lib64/ld-linux-x86-64.so.2 ;; arm64) echo /lib/ld-linux-aarch64.so.1 ;;
    s390x) echo /lib/ld64.so.1 ;; ppc64el) echo /lib64/ld64.so.2 ;;
  esac
}
