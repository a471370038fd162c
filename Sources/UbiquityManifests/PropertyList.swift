import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
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
        let bytes = try utf8Text(bytes)
        // libxml2 reports bad UTF-8 late (at the end of the file) and Foundation's XMLParser traps
        // on it in element names, so find it first, where the bytes are.
        if let bad = invalidUTF8(bytes) {
            let (line, column) = lineAndColumn(of: bad, in: bytes)
            throw PlistReadError(message: "the file is not valid UTF-8: byte 0x\(String(bytes[bad], radix: 16, uppercase: true)) at line \(line), column \(column) is not part of a UTF-8 character",
                                 fix: "save the file as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8), or declare its encoding in <?xml … encoding=\"…\"?>")
        }
        let looksLikeXML = bytes.drop(while: { $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 || $0 == 0xEF || $0 == 0xBB || $0 == 0xBF }).first == UInt8(ascii: "<")
        if !looksLikeXML {
            throw PlistReadError(message: "the file is neither an XML nor a binary (bplist00) property list")
        }
        if let (offset, what, fix) = markupXMLParserCrashesOn(bytes) {
            let (line, column) = lineAndColumn(of: offset, in: bytes)
            throw PlistReadError(message: "the file is not a valid XML property list: \(what) at line \(line), column \(column)", fix: fix)
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

/// Offset of the first byte that is not part of a valid UTF-8 sequence, or nil.
func invalidUTF8(_ bytes: [UInt8]) -> Int? {
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

// MARK: Before Foundation's XMLParser reads a file
//
// Foundation's XMLParser (Linux) crashes on some input libxml2 accepts: it reads a processing
// instruction's data and parts of DTD declarations with strlen, which is NULL when they are absent
// (`<?x?>`, `<!ATTLIST a b CDATA #IMPLIED>`, `<!NOTATION n SYSTEM "x">`), and traps on bad UTF-8 in
// a name. So the reader gives it only UTF-8 it has checked: it converts other encodings itself (libxml2
// would decode them leniently, e.g. from a malformed declaration or UTF-7 escapes, into what the
// checks below could not see) and refuses DOCTYPEs with an internal subset (a property list has
// none; through entities they can also hide a `<?x?>`).

/// `<?xml version="…" encoding="…" standalone="…"?>` at the start of a file, as XML defines it.
enum XMLDeclaration: Equatable {
    case none
    case malformed
    /// Where the encoding name is, when there is one.
    case wellFormed(encoding: Range<Int>?)
}

func xmlDeclaration(_ bytes: [UInt8]) -> XMLDeclaration {
    var i = bytes.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0   // a UTF-8 byte order mark
    func space() -> Bool {
        let start = i
        while i < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[i]) { i += 1 }
        return i > start
    }
    func literal(_ s: String) -> Bool {
        let u = Array(s.utf8)
        guard bytes.count - i >= u.count, bytes[i..<(i + u.count)].elementsEqual(u) else { return false }
        i += u.count
        return true
    }
    /// `= "value"` or `= 'value'`, the value valid by `valid`: where it is.
    func value(_ valid: (ArraySlice<UInt8>) -> Bool) -> Range<Int>? {
        _ = space()
        guard literal("=") else { return nil }
        _ = space()
        guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") || bytes[i] == UInt8(ascii: "'") else { return nil }
        let quote = bytes[i]
        let start = i + 1
        guard let end = bytes[start...].prefix(100).firstIndex(of: quote), valid(bytes[start..<end]) else { return nil }
        i = end + 1
        return start..<end
    }
    func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }
    func isLetter(_ c: UInt8) -> Bool { (c | 0x20) >= 0x61 && (c | 0x20) <= 0x7A }
    guard literal("<?xml"), space() else { return .none }
    // VersionNum: [0-9]+ '.' [0-9]+
    guard literal("version"), value({ v in
        let parts = v.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        return parts.count == 2 && parts.allSatisfy { !$0.isEmpty && $0.allSatisfy(isDigit) }
    }) != nil else { return .malformed }
    var encoding: Range<Int>?
    var separated = space()
    if separated, literal("encoding") {
        // EncName: [A-Za-z] ([A-Za-z0-9._] | '-')*
        encoding = value { v in
            guard let first = v.first, isLetter(first) else { return false }
            return v.allSatisfy { isLetter($0) || isDigit($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-") }
        }
        guard encoding != nil else { return .malformed }
        separated = space()
    }
    if separated, literal("standalone") {
        guard value({ $0.elementsEqual("yes".utf8) || $0.elementsEqual("no".utf8) }) != nil else { return .malformed }
        _ = space()
    }
    return literal("?>") ? .wellFormed(encoding: encoding) : .malformed
}

/// The encoding an XML declaration names, or nil.
func declaredEncoding(_ bytes: [UInt8]) -> String? {
    guard case .wellFormed(let range?) = xmlDeclaration(bytes) else { return nil }
    return String(decoding: bytes[range], as: UTF8.self)
}

/// The file as UTF-8, with its declaration (if any) saying so: converted from what a byte order mark
/// (or "<?" in UTF-16 or UTF-32, which libxml2 also detects) or the XML declaration says, with iconv,
/// which libxml2 would have used.
func utf8Text(_ bytes: [UInt8]) throws(PlistReadError) -> [UInt8] {
    func unreadable(_ what: String) -> PlistReadError {
        PlistReadError(message: what, fix: "save the file as UTF-8, with <?xml version=\"1.0\" encoding=\"UTF-8\"?> or no declaration")
    }
    func converted(_ bytes: [UInt8], from encoding: String, _ why: String) throws(PlistReadError) -> [UInt8] {
        switch iconvToUTF8(bytes, from: encoding) {
        case .success(let text): return text
        case .failure(.unknownEncoding):
            throw unreadable("the file is in the encoding \(quoted(encoding)) (\(why)), which this system cannot convert")
        case .failure(.invalid(let offset)):
            let (line, column) = lineAndColumn(of: offset, in: bytes)
            throw unreadable("the file is not valid \(oneLine(encoding).text) (\(why)): the bytes at line \(line), column \(column) cannot be read in it")
        }
    }
    var text = bytes
    var convertedAlready = false
    let marks: [(mark: [UInt8], isBOM: Bool, encoding: String)] = [
        ([0, 0, 0xFE, 0xFF], true, "UTF-32BE"), ([0xFF, 0xFE, 0, 0], true, "UTF-32LE"),
        ([0xFE, 0xFF], true, "UTF-16BE"), ([0xFF, 0xFE], true, "UTF-16LE"),
        ([0, 0, 0, 0x3C], false, "UTF-32BE"), ([0x3C, 0, 0, 0], false, "UTF-32LE"),
        ([0, 0x3C, 0, 0x3F], false, "UTF-16BE"), ([0x3C, 0, 0x3F, 0], false, "UTF-16LE"),
    ]
    if let m = marks.first(where: { bytes.starts(with: $0.mark) }) {
        text = try converted(Array(bytes.dropFirst(m.isBOM ? m.mark.count : 0)), from: m.encoding,
                             m.isBOM ? "by its byte order mark" : "by its first bytes")
        convertedAlready = true
    }
    switch xmlDeclaration(text) {
    case .none, .wellFormed(encoding: nil):
        return text
    case .malformed:
        throw PlistReadError(message: "the file is not well-formed XML (the XML declaration <?xml …?> at its start is malformed)")
    case .wellFormed(var range?):
        let name = String(decoding: text[range], as: UTF8.self)
        if !convertedAlready {
            if ["UTF-8", "UTF8"].contains(name.uppercased()) { return text }
            text = try converted(text, from: name, "as its XML declaration says")
            guard case .wellFormed(let again?) = xmlDeclaration(text) else {
                throw unreadable("the file declares the encoding \(quoted(name)), but its text is not in that encoding")
            }
            range = again
        }
        text.replaceSubrange(range, with: Array("UTF-8".utf8))
        return text
    }
}

enum ConversionFailure: Error { case unknownEncoding, invalid(at: Int) }

/// `bytes` converted from `encoding` to UTF-8 by iconv.
func iconvToUTF8(_ bytes: [UInt8], from encoding: String) -> Result<[UInt8], ConversionFailure> {
    let cd = iconv_open("UTF-8", encoding)
    guard cd != iconv_t(bitPattern: -1) else { return .failure(.unknownEncoding) }
    defer { iconv_close(cd) }
    guard !bytes.isEmpty else { return .success([]) }
    var input = bytes
    let capacity = 4 * bytes.count + 16   // no encoding takes more than 4 UTF-8 bytes per input byte
    var failedAt: Int?
    let output = [UInt8](unsafeUninitializedCapacity: capacity) { out, produced in
        input.withUnsafeMutableBytes { raw in
            var inPointer: UnsafeMutablePointer<CChar>? = raw.baseAddress!.assumingMemoryBound(to: CChar.self)
            var inLeft = raw.count
            var outPointer: UnsafeMutablePointer<CChar>? = UnsafeMutableRawPointer(out.baseAddress!).assumingMemoryBound(to: CChar.self)
            var outLeft = capacity
            if iconv(cd, &inPointer, &inLeft, &outPointer, &outLeft) == -1 || iconv(cd, nil, nil, &outPointer, &outLeft) == -1 {
                failedAt = raw.count - inLeft
            }
            produced = capacity - outLeft
        }
    }
    if let failedAt { return .failure(.invalid(at: failedAt)) }
    return .success(output)
}

/// What Foundation's XMLParser would crash on or misread, with the offset, what it is and what to do.
func markupXMLParserCrashesOn(_ text: [UInt8]) -> (Int, String, String)? {
    let n = text.count
    func at(_ i: Int, _ s: String) -> Bool { n - i >= s.utf8.count && text[i..<(i + s.utf8.count)].elementsEqual(s.utf8) }
    for i in 0..<n where text[i] == 0 || (text[i] == UInt8(ascii: "<") && i + 1 < n && (text[i + 1] == UInt8(ascii: "!") || text[i + 1] == UInt8(ascii: "?"))) {
        switch text[i] {
        case 0:
            // Never valid in XML; also, libxml2 takes "\0\0\0<" for the start of UTF-32.
            return (i, "it holds a NUL byte", "remove it")
        case UInt8(ascii: "<") where at(i, "<!DOCTYPE"):
            // An internal subset starts at a "[" before the DOCTYPE's ">" (outside its quoted IDs).
            var j = i + 9
            var quote: UInt8?
            while j < n {
                let c = text[j]
                if let q = quote { if c == q { quote = nil } } else if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") { quote = c } else if c == UInt8(ascii: ">") { break } else if c == UInt8(ascii: "[") {
                    return (j, "its DOCTYPE has an internal subset ([…]), with declarations a property list does not use",
                            "remove the part in [ ]: <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">")
                }
                j += 1
            }
        case UInt8(ascii: "<") where at(i, "<?"):
            // A processing instruction whose target is followed directly by "?>" has no data.
            var j = i + 2
            while j < n, ![0x20, 0x09, 0x0A, 0x0D, UInt8(ascii: "?"), UInt8(ascii: ">"), UInt8(ascii: "<")].contains(text[j]) { j += 1 }
            if j > i + 2, at(j, "?>") {
                return (i, "\(quoted(String(decoding: text[i..<(j + 2)], as: UTF8.self))) is a processing instruction without data, which the XML reader cannot read",
                        "remove it; a property list needs none")
            }
        default: break
        }
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
