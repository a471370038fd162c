import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif

// A property-list reader that keeps dictionary keys in the order they are written.
//
// `PropertyListSerialization` returns an unordered dictionary, but a manifest's default container is
// the *first declared* one, and Boolean and integer values must be told apart for type errors. So this
// module reads both formats itself into `PlistValue`: XML through Foundation's `XMLParser`, binary
// (`bplist00`) with a small reader of Apple's documented format (CFBinaryPList.c).

/// A property-list value. Dictionaries keep their entries in file order, duplicates included.
enum PlistValue: Sendable, Equatable {
    case string(String)
    case bool(Bool)
    case integer(Int64)
    case real(Double)
    case date(String)
    case data([UInt8])
    case array([PlistValue])
    case dictionary([(key: String, value: PlistValue)])

    static func == (a: PlistValue, b: PlistValue) -> Bool {
        switch (a, b) {
        case let (.string(x), .string(y)): return Array(x.utf8) == Array(y.utf8)
        case let (.bool(x), .bool(y)): return x == y
        case let (.integer(x), .integer(y)): return x == y
        case let (.real(x), .real(y)): return x == y
        case let (.date(x), .date(y)): return x == y
        case let (.data(x), .data(y)): return x == y
        case let (.array(x), .array(y)): return x == y
        case let (.dictionary(x), .dictionary(y)):
            return x.count == y.count && zip(x, y).allSatisfy { Array($0.key.utf8) == Array($1.key.utf8) && $0.value == $1.value }
        default: return false
        }
    }

    /// The type's name as used in messages ("a string", "a Boolean", ...).
    var typeDescription: String {
        switch self {
        case .string: return "a string"
        case .bool: return "a Boolean"
        case .integer: return "an integer"
        case .real: return "a real number"
        case .date: return "a date"
        case .data: return "data"
        case .array: return "an array"
        case .dictionary: return "a dictionary"
        }
    }
}

/// Why a file is not a property list. `message` completes "FILE: error: <message>".
struct PlistReadError: Error, Equatable {
    var message: String
    /// What to do about it, when the reader knows better than the generic advice.
    var fix: String? = nil
}

enum PlistFormat: Sendable { case xml, binary }

/// Deepest nesting of arrays and dictionaries either reader accepts. An Info.plist nests a few
/// levels; the cap keeps every walk over a parsed value (its teardown included, which Swift does
/// recursively) far from the stack's limit, whatever the file holds.
let maximumPlistNesting = 512

/// Reads an XML or binary property list, keeping dictionary key order.
func readPropertyList(_ bytes: [UInt8]) throws(PlistReadError) -> (PlistValue, PlistFormat) {
    if bytes.starts(with: Array("bplist".utf8)) {
        var reader = BinaryPlistReader(bytes: bytes)
        return (try reader.read(), .binary)
    }
    return (try XMLPlistReader.read(bytes), .xml)
}

// MARK: - XML

/// Builds a `PlistValue` from `XMLParser` events (Apple's PropertyList-1.0 DTD).
final class XMLPlistReader: NSObject, XMLParserDelegate {
    /// What a frame is building. A class, so appending happens in place: as an enum payload the
    /// array or text was copied at each append while the stack still held it, which made wide
    /// arrays, dictionaries and long texts quadratic (200,000 entries took minutes).
    private final class Building<T> {
        var value: T
        init(_ value: T) { self.value = value }
    }

    private enum Frame {
        case plist(PlistValue?)
        case dictionary(Building<[(key: String, value: PlistValue)]>, pendingKey: String?)
        case array(Building<[PlistValue]>)
        case text(element: String, Building<String>)   // key, string, integer, real, date, data
        case empty(element: String)                    // true, false
    }

    private var stack: [Frame] = []
    private var result: PlistValue?
    private var failure: PlistReadError?
    private weak var parser: XMLParser?

    static func read(_ bytes: [UInt8]) throws(PlistReadError) -> PlistValue {
        if bytes.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) {
            throw PlistReadError(message: bytes.isEmpty ? "the file is empty"
                                                        : "the file holds only white space")
        }
        // libxml2 reports bad UTF-8 late (at the end of the file) and Foundation's XMLParser traps
        // on it in element names, so find it first, where the bytes are.
        if let bad = invalidUTF8(bytes) {
            let (line, column) = lineAndColumn(of: bad, in: bytes)
            throw PlistReadError(message: "the file is not valid UTF-8: byte 0x\(String(bytes[bad], radix: 16, uppercase: true)) at line \(line), column \(column) is not part of a UTF-8 character",
                                 fix: "save the file as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8), or declare its encoding in <?xml … encoding=\"…\"?>")
        }
        let parser = XMLParser(data: Data(bytes))
        let builder = XMLPlistReader()
        builder.parser = parser
        parser.delegate = builder
        parser.shouldResolveExternalEntities = false
        let ok = parser.parse()
        // Linux's XMLParser can return true *and* set parserError (e.g. on a mismatched end tag).
        if let failure = builder.failure { throw failure }
        if !ok || parser.parserError != nil {
            let looksLikeXML = bytes.drop(while: { $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 || $0 == 0xEF || $0 == 0xBB || $0 == 0xBF }).first == UInt8(ascii: "<")
            if !looksLikeXML {
                throw PlistReadError(message: "the file is neither an XML nor a binary (bplist00) property list")
            }
            if let run = longestTextRun(bytes), run.length >= xmlTextLimit - 4096 {
                let (line, _) = lineAndColumn(of: run.start, in: bytes)
                throw PlistReadError(message: "a value at line \(line) is \(run.length) bytes long; the XML reader (libxml2) stops at \(xmlTextLimit) bytes, so values this long cannot be read",
                                 fix: "shorten the value; an Info.plist value is a few KB at most")
            }
            throw PlistReadError(message: "the file is not well-formed XML (syntax error at line \(parser.lineNumber), column \(parser.columnNumber))")
        }
        guard let value = builder.result else {
            throw PlistReadError(message: "the file holds no property-list value (no <plist> or <dict> element)")
        }
        return value
    }

    private func fail(_ message: String, fix: String? = nil) {
        guard failure == nil else { return }
        let line = parser?.lineNumber ?? 0
        failure = PlistReadError(message: "the file is not a valid XML property list: \(message) at line \(line)", fix: fix)
        parser?.abortParsing()
    }

    private static let valueElements: Set<String> = ["dict", "array", "key", "string", "integer", "real", "date", "data", "true", "false"]

    func parser(_ parser: XMLParser, didStartElement elementName: String, namespaceURI: String?,
                qualifiedName: String?, attributes: [String: String] = [:]) {
        guard failure == nil else { return }
        if elementName == "plist" {
            guard stack.isEmpty, result == nil else { return fail("<plist> inside another element") }
            stack.append(.plist(nil))
            return
        }
        guard Self.valueElements.contains(elementName) else {
            return fail("unknown element <\(oneLine(elementName).text)>")
        }
        // Where may this element go?
        switch stack.last {
        case nil:
            if result != nil { return fail("more than one top-level value") }
            if elementName == "key" { return fail("<key> outside a <dict>") }
        case .plist(let v)?:
            if v != nil { return fail("more than one value inside <plist>") }
            if elementName == "key" { return fail("<key> outside a <dict>") }
        case .dictionary(_, let pending)?:
            if pending == nil && elementName != "key" {
                return fail("<\(elementName)> in a <dict> where a <key> belongs")
            }
            if pending != nil && elementName == "key" {
                return fail("<key> in a <dict> where the previous key's value belongs")
            }
        case .array?:
            if elementName == "key" { return fail("<key> inside an <array>") }
        case .text(let element, _)?, .empty(let element)?:
            return fail("<\(elementName)> inside <\(element)>")
        }
        if (elementName == "dict" || elementName == "array") && stack.count > maximumPlistNesting {
            return fail("arrays and dictionaries are nested more than \(maximumPlistNesting) levels deep",
                        fix: "an Info.plist nests a few levels; remove the deep nesting")
        }
        switch elementName {
        case "dict": stack.append(.dictionary(Building([]), pendingKey: nil))
        case "array": stack.append(.array(Building([])))
        case "true", "false": stack.append(.empty(element: elementName))
        default: stack.append(.text(element: elementName, Building("")))
        }
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) {
        appendText(string)
    }

    func parser(_ parser: XMLParser, foundCDATA CDATABlock: Data) {
        appendText(String(decoding: CDATABlock, as: UTF8.self))
    }

    private func appendText(_ string: String) {
        guard failure == nil, let top = stack.last else { return }
        if case .text(_, let text) = top {
            text.value += string
        } else if !string.allSatisfy({ $0.isWhitespace }) {
            let shown = string.trimmingCharacters(in: .whitespacesAndNewlines)
            fail("stray text \(quoted(String(shown.prefix(40)))) outside a value element")
        }
    }

    func parser(_ parser: XMLParser, didEndElement elementName: String, namespaceURI: String?, qualifiedName: String?) {
        guard failure == nil, let top = stack.popLast() else { return }
        let value: PlistValue
        switch top {
        case .plist(let v):
            result = v
            return
        case .dictionary(let entries, let pending):
            if let pending { return fail("the key \(quoted(pending)) has no value") }
            value = .dictionary(entries.value)
        case .array(let items):
            value = .array(items.value)
        case .empty(let element):
            value = .bool(element == "true")
        case .text(let element, let building):
            let text = building.value
            switch element {
            case "key":
                guard case .dictionary(let entries, nil)? = stack.last else { return fail("misplaced <key>") }
                stack[stack.count - 1] = .dictionary(entries, pendingKey: text)
                return
            case "string": value = .string(text)
            case "integer":
                let t = text.trimmingCharacters(in: .whitespacesAndNewlines)
                guard let n = Self.parseInteger(t) else { return fail("\(quoted(t)) is not an integer") }
                value = .integer(n)
            case "real":
                let t = text.trimmingCharacters(in: .whitespacesAndNewlines)
                guard let d = Double(t) else { return fail("\(quoted(t)) is not a real number") }
                value = .real(d)
            case "date": value = .date(text.trimmingCharacters(in: .whitespacesAndNewlines))
            case "data":
                let compact = text.filter { !$0.isWhitespace }
                guard let d = Data(base64Encoded: compact) else { return fail("<data> is not valid base64") }
                value = .data([UInt8](d))
            default: return fail("unknown element <\(element)>")
            }
        }
        attach(value)
    }

    private func attach(_ value: PlistValue) {
        switch stack.last {
        case nil: result = value
        case .plist?: stack[stack.count - 1] = .plist(value)
        case .dictionary(let entries, let pending?)?:
            entries.value.append((key: pending, value: value))
            stack[stack.count - 1] = .dictionary(entries, pendingKey: nil)
        case .array(let items)?:
            items.value.append(value)
        default: fail("misplaced value")
        }
    }

    private static func parseInteger(_ t: String) -> Int64? {
        var s = Substring(t)
        var negative = false
        if s.hasPrefix("-") { negative = true; s = s.dropFirst() } else if s.hasPrefix("+") { s = s.dropFirst() }
        let magnitude: UInt64?
        if s.hasPrefix("0x") || s.hasPrefix("0X") { magnitude = UInt64(s.dropFirst(2), radix: 16) } else { magnitude = UInt64(s) }
        guard let m = magnitude else { return nil }
        if negative { return m <= UInt64(Int64.max) + 1 ? Int64(truncatingIfNeeded: 0 &- m) : nil }
        return Int64(truncatingIfNeeded: m)   // unsigned 64-bit values wrap, as CoreFoundation stores them
    }
}

/// libxml2's limit (XML_MAX_LOOKUP_LIMIT) on how far it looks for the next markup without the
/// XML_PARSE_HUGE option, which Foundation's XMLParser does not set.
let xmlTextLimit = 10_000_000

/// The longest text between markup: from a ">" to the next "<" (or the file's end).
private func longestTextRun(_ bytes: [UInt8]) -> (start: Int, length: Int)? {
    var best: (start: Int, length: Int)?
    var start = 0
    for i in 0...bytes.count {
        let b = i < bytes.count ? bytes[i] : UInt8(ascii: "<")
        if b == UInt8(ascii: ">") {
            start = i + 1
        } else if b == UInt8(ascii: "<") {
            if i - start > (best?.length ?? -1) { best = (start, i - start) }
            start = i + 1
        }
    }
    return best
}

/// Offset of the first byte that is not part of a valid UTF-8 sequence, or nil. Files that say
/// they are in another encoding (a UTF-16 or UTF-32 byte order mark, or an `encoding=` other than
/// UTF-8 in the XML declaration) are left to the XML reader.
func invalidUTF8(_ bytes: [UInt8]) -> Int? {
    if bytes.starts(with: [0xFE, 0xFF]) || bytes.starts(with: [0xFF, 0xFE]) || bytes.starts(with: [0, 0]) { return nil }
    if bytes.starts(with: Array("<?xml".utf8)) {
        let declaration = String(decoding: bytes.prefix(while: { $0 != UInt8(ascii: ">") }).prefix(200), as: UTF8.self).lowercased()
        // encoding = "…" (XML allows white space around "=").
        if let range = declaration.range(of: "encoding") {
            let rest = declaration[range.upperBound...].drop { $0 == " " || $0 == "\t" || $0 == "\r" || $0 == "\n" }
            if rest.first == "=" {
                let quoted = rest.dropFirst().drop { $0 == " " || $0 == "\t" || $0 == "\r" || $0 == "\n" }
                let value = quoted.dropFirst().prefix { $0 != "\"" && $0 != "'" }
                if value != "utf-8" && value != "utf8" { return nil }
            }
        }
    }
    var i = 0
    let n = bytes.count
    while i < n {
        let b = bytes[i]
        if b < 0x80 { i += 1; continue }
        let length: Int
        var minimum: UInt32
        var scalar: UInt32
        switch b {
        case 0xC2...0xDF: length = 2; minimum = 0x80; scalar = UInt32(b & 0x1F)
        case 0xE0...0xEF: length = 3; minimum = 0x800; scalar = UInt32(b & 0x0F)
        case 0xF0...0xF4: length = 4; minimum = 0x10000; scalar = UInt32(b & 0x07)
        default: return i
        }
        guard i + length <= n else { return i }
        for k in 1..<length {
            let c = bytes[i + k]
            guard c & 0xC0 == 0x80 else { return i }
            scalar = scalar << 6 | UInt32(c & 0x3F)
        }
        if scalar < minimum || scalar > 0x10FFFF || (0xD800...0xDFFF).contains(scalar) { return i }
        i += length
    }
    return nil
}

/// 1-based line and column (in bytes) of `offset`.
func lineAndColumn(of offset: Int, in bytes: [UInt8]) -> (line: Int, column: Int) {
    var line = 1
    var lineStart = 0
    for i in 0..<min(offset, bytes.count) where bytes[i] == 0x0A {
        line += 1
        lineStart = i + 1
    }
    return (line, offset - lineStart + 1)
}

// MARK: - Binary

/// Reads `bplist00` files: header, objects, offset table, 32-byte trailer.
struct BinaryPlistReader {
    let bytes: [UInt8]
    private var offsets: [Int] = []
    private var refSize = 0
    private var inProgress: Set<Int> = []
    private var objectsDecoded = 0
    private var bytesDecoded = 0

    /// Most bytes of strings, data and references read, counting an object each time it is referenced.
    /// Objects may be shared, so a small file can reference one 4 MB string a million times (terabytes
    /// to copy). A file without shared objects reads each of its bytes once; shared strings add a little.
    private var maximumDecodedBytes: Int { min(maximumManifestSize, max(1 << 20, 4 * bytes.count)) }

    init(bytes: [UInt8]) { self.bytes = bytes }

    private func bad(_ what: String) -> PlistReadError {
        PlistReadError(message: "the file is not a valid binary property list: \(what)")
    }

    mutating func read() throws(PlistReadError) -> PlistValue {
        guard bytes.starts(with: Array("bplist00".utf8)) else {
            let version = String(decoding: bytes.dropFirst(6).prefix(2), as: UTF8.self)
            throw PlistReadError(message: "the file is a binary property list of unsupported version \(quoted(version))")
        }
        guard bytes.count >= 8 + 1 + 32 else { throw bad("the file is truncated") }
        let t = bytes.count - 32
        let offsetSize = Int(bytes[t + 6])
        refSize = Int(bytes[t + 7])
        let numObjects = readUInt(at: t + 8, size: 8)
        let topObject = readUInt(at: t + 16, size: 8)
        let tableOffset = readUInt(at: t + 24, size: 8)
        guard (1...8).contains(offsetSize), (1...8).contains(refSize) else { throw bad("corrupt trailer") }
        guard numObjects > 0, numObjects < UInt64(bytes.count), topObject < numObjects else { throw bad("corrupt trailer") }
        guard tableOffset >= 9, tableOffset < UInt64(t),
              UInt64(t) - tableOffset >= numObjects * UInt64(offsetSize) else { throw bad("corrupt offset table") }
        let count = Int(numObjects)
        offsets.reserveCapacity(count)
        for i in 0..<count {
            let o = readUInt(at: Int(tableOffset) + i * offsetSize, size: offsetSize)
            guard o >= 8, o < tableOffset else { throw bad("object \(i) lies outside the object area") }
            offsets.append(Int(o))
        }
        return try object(Int(topObject), depth: 0)
    }

    private func readUInt(at position: Int, size: Int) -> UInt64 {
        var v: UInt64 = 0
        for i in 0..<size { v = (v << 8) | UInt64(bytes[position + i]) }
        return v
    }

    private mutating func consume(_ count: Int) throws(PlistReadError) {
        bytesDecoded += count
        guard bytesDecoded <= maximumDecodedBytes else {
            throw bad("its objects, counted each time they are referenced, come to more than \(maximumDecodedBytes) bytes")
        }
    }

    private func need(_ position: Int, _ count: Int) throws(PlistReadError) {
        guard position >= 0, count >= 0, position <= bytes.count - 32, count <= bytes.count - 32 - position else {
            throw bad("an object runs past the end of the data")
        }
    }

    /// Length of a collection or string: low nibble, or 0xF followed by an integer object.
    private func length(marker: UInt8, at position: inout Int) throws(PlistReadError) -> Int {
        let low = Int(marker & 0x0F)
        if low != 0x0F { return low }
        try need(position, 1)
        let intMarker = bytes[position]
        guard intMarker & 0xF0 == 0x10, intMarker & 0x0F <= 3 else { throw bad("corrupt length") }
        let size = 1 << Int(intMarker & 0x0F)
        try need(position + 1, size)
        let v = readUInt(at: position + 1, size: size)
        position += 1 + size
        guard v < UInt64(bytes.count) else { throw bad("corrupt length") }
        return Int(v)
    }

    private func ref(at position: Int) -> Int {
        let v = readUInt(at: position, size: refSize)
        return v < UInt64(Int.max) ? Int(v) : Int.max
    }

    private mutating func object(_ index: Int, depth: Int) throws(PlistReadError) -> PlistValue {
        guard index < offsets.count else { throw bad("reference to a missing object") }
        guard depth < maximumPlistNesting else { throw bad("arrays and dictionaries are nested more than \(maximumPlistNesting) levels deep") }
        guard !inProgress.contains(index) else { throw bad("an object contains itself") }
        objectsDecoded += 1
        // A shared array or dictionary is decoded each time it is referenced: in a few hundred bytes,
        // arrays that each reference the next one twice make 2^64 objects. A file without shared
        // collections follows each of its references once, and has fewer references than bytes.
        guard objectsDecoded <= min(1_000_000, bytes.count) else {
            throw bad("its arrays and dictionaries refer to objects more than \(min(1_000_000, bytes.count)) times (shared ones count each time)")
        }
        var p = offsets[index]
        try need(p, 1)
        let marker = bytes[p]
        p += 1
        switch marker >> 4 {
        case 0x0:
            switch marker {
            case 0x08: return .bool(false)
            case 0x09: return .bool(true)
            default: throw bad("unsupported object (marker 0x\(String(marker, radix: 16)))")
            }
        case 0x1:
            let n = Int(marker & 0x0F)
            guard n <= 4 else { throw bad("corrupt integer") }
            let size = 1 << n
            try need(p, size)
            if size == 16 { return .integer(Int64(bitPattern: readUInt(at: p + 8, size: 8))) }
            let v = readUInt(at: p, size: size)
            return .integer(size == 8 ? Int64(bitPattern: v) : Int64(v))
        case 0x2:
            let size = 1 << Int(marker & 0x0F)
            guard size == 4 || size == 8 else { throw bad("corrupt real") }
            try need(p, size)
            let v = readUInt(at: p, size: size)
            return .real(size == 4 ? Double(Float(bitPattern: UInt32(v))) : Double(bitPattern: v))
        case 0x3:
            guard marker == 0x33 else { throw bad("corrupt date") }
            try need(p, 8)
            let seconds = Double(bitPattern: readUInt(at: p, size: 8))
            return .date(ISO8601DateFormatter().string(from: Date(timeIntervalSinceReferenceDate: seconds)))
        case 0x4:
            let n = try length(marker: marker, at: &p)
            try need(p, n)
            try consume(n)
            return .data(Array(bytes[p..<p + n]))
        case 0x5:
            let n = try length(marker: marker, at: &p)
            try need(p, n)
            try consume(n)
            let slice = bytes[p..<p + n]
            guard slice.allSatisfy({ $0 < 0x80 }) else { throw bad("an ASCII string holds non-ASCII bytes") }
            return .string(String(decoding: slice, as: UTF8.self))
        case 0x6:
            let n = try length(marker: marker, at: &p)
            guard n <= (bytes.count - 32) / 2 else { throw bad("an object runs past the end of the data") }
            try need(p, n * 2)
            try consume(n * 2)
            var units: [UInt16] = []
            units.reserveCapacity(n)
            for i in 0..<n { units.append(UInt16(bytes[p + 2 * i]) << 8 | UInt16(bytes[p + 2 * i + 1])) }
            var s = ""
            var it = units.makeIterator()
            var decoder = UTF16()
            loop: while true {
                switch decoder.decode(&it) {
                case .scalarValue(let c): s.unicodeScalars.append(c)
                case .emptyInput: break loop
                case .error: throw bad("a UTF-16 string is not valid UTF-16")
                }
            }
            return .string(s)
        case 0x8:
            throw bad("it holds a UID (it is a keyed archive, not an Info.plist)")
        case 0xA, 0xC:
            let n = try length(marker: marker, at: &p)
            guard n <= (bytes.count - 32) / refSize else { throw bad("an object runs past the end of the data") }
            try need(p, n * refSize)
            try consume(n * refSize)
            inProgress.insert(index)
            defer { inProgress.remove(index) }
            var items: [PlistValue] = []
            for i in 0..<n { items.append(try object(ref(at: p + i * refSize), depth: depth + 1)) }
            return .array(items)
        case 0xD:
            let n = try length(marker: marker, at: &p)
            guard n <= (bytes.count - 32) / (2 * refSize) else { throw bad("an object runs past the end of the data") }
            try need(p, 2 * n * refSize)
            try consume(2 * n * refSize)
            inProgress.insert(index)
            defer { inProgress.remove(index) }
            var entries: [(key: String, value: PlistValue)] = []
            entries.reserveCapacity(n)
            for i in 0..<n {
                let keyObject = try object(ref(at: p + i * refSize), depth: depth + 1)
                guard case .string(let key) = keyObject else { throw bad("a dictionary key is \(keyObject.typeDescription), not a string") }
                let value = try object(ref(at: p + (n + i) * refSize), depth: depth + 1)
                entries.append((key: key, value: value))
            }
            return .dictionary(entries)
        default:
            throw bad("unsupported object (marker 0x\(String(marker, radix: 16)))")
        }
    }
}

// MARK: - Quoting for messages

/// The most of a value (in UTF-8 bytes) that a message shows: a manifest's value can be megabytes
/// long, and a diagnostic must stay one readable line.
let maximumShownBytes = 300

/// `s` for a one-line message: control characters and line breaks escaped (and `"` when it goes
/// between quotes), cut with "…" after about `limit` bytes. `cut` says whether it was.
func oneLine<S: StringProtocol>(_ s: S, limit: Int = maximumShownBytes, quoting: Bool = false) -> (text: String, cut: Bool) {
    var out = ""
    var shown = 0
    for scalar in s.unicodeScalars {
        if shown >= limit { return (out + "…", true) }
        shown += UTF8.width(scalar)
        switch scalar {
        case "\"" where quoting: out += "\\\""
        case "\\" where quoting: out += "\\\\"
        case "\n": out += "\\n"
        case "\t": out += "\\t"
        case "\r": out += "\\r"
        case "\0": out += "\\0"
        default:
            // C0 and C1 controls, DEL, and the Unicode line and paragraph separators.
            if scalar.value < 0x20 || (0x7F...0x9F).contains(scalar.value) || scalar.value == 0x2028 || scalar.value == 0x2029 {
                out += "\\u{\(String(scalar.value, radix: 16))}"
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
    }
    return (out, false)
}

/// A value quoted for a one-line message: `"a\nb"` with control characters escaped; a long value is
/// cut and its length given: `"aaa…" (1000000 bytes)`.
func quoted(_ s: String) -> String {
    let (text, cut) = oneLine(s, quoting: true)
    return "\"" + text + "\"" + (cut ? " (\(s.utf8.count) bytes)" : "")
}
